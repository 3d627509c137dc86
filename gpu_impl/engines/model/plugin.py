"""The model's answers to the engine interface (:class:`gpu_impl.plugin.EnginePlugin`): the scenario's policy runs
(guard, metadata heads, runner hygiene, seeded defects), its gate proves every theorem, there is nothing to conform."""

from __future__ import annotations

from gpu_impl.plugin import EnginePlugin


class ModelPlugin(EnginePlugin):
    def open(self, spec, policy=None):
        from gpu_impl.engines.model.sut import ModelSUT

        return ModelSUT(spec, policy=policy)

    def open_options(self, spec, policy=None) -> dict:
        return {} if policy is None else {"policy": policy}

    def runs_scenario_policy(self, spec) -> bool:
        return True

    def policy_option_refusal(self, spec, option, replay=False):
        return None

    def policy_record(self, policy, sut) -> dict:
        return policy.to_dict()

    def summary_policy(self, record, spec) -> dict:
        return record

    def judging_build(self, spec, scenario) -> str:
        return scenario.fa3_build

    def found_on(self, spec) -> str:
        return "the model"

    def ran_on(self, spec, scenario=None) -> str:
        if scenario is None:
            return "the model"
        defects = scenario.all_defects() if hasattr(scenario, "all_defects") else scenario.defects
        extra = f", seeded defects {', '.join(sorted(defects))}" if defects else ""
        return f"the model (guard {scenario.guard_spec!r}, heads {scenario.metadata_heads}{extra})"

    def guard_words(self, spec, scenario) -> str:
        return f"guard {scenario.guard_spec!r}"

    def run_label(self, spec) -> str:
        return ""

    def fuzz_check_name(self, spec, kernel_name: str) -> str:
        return f"fuzz ({kernel_name}): no OOB, no NaN, matches oracle"

    def replay_guard(self, spec, policy):
        return policy.guard_spec

    def pairs(self, scenario, result) -> list:
        from gpu_impl.model_pairs import model_pairs

        try:
            return model_pairs(scenario, result)
        except Exception:  # a trace the pair recorder cannot read: the terms lack the arguments, nothing else
            return []

    def named_only(self, spec) -> bool:
        return False

    def applies_defects(self, spec) -> bool:
        return True

    def proof_stages(self, spec) -> tuple:
        return ("theorems",)

    def runs_ranks_in_process(self, spec) -> bool:
        return True

    def conformance(self, spec):
        return None
