"""The model as the built-in engine: our model of sglang's backend (``gpu_impl.engines.model.sut.ModelSUT`` over
``gpu_impl.backend`` and ``gpu_impl.scenario.run_scenario``), the one engine whose policy is the harness's."""
