"""The prover's domain, the case format and the backend's configuration describe the same thing."""

import dataclasses

from spec.model import domain as D
from spec.model.cases import MODEL_FIELDS, SERVER_FIELDS
from spec.model.config import MODELS, ModelConfig, ServerConfig, config_violations


def test_case_format_fields_are_the_configuration_fields():
    assert set(SERVER_FIELDS) == {f.name for f in dataclasses.fields(ServerConfig)}
    assert set(MODEL_FIELDS) == {f.name for f in dataclasses.fields(ModelConfig)}


def test_every_configuration_the_prover_quantifies_over_is_one_the_backend_accepts():
    configs = list(D.enumerate_configs(num_sms=(132,), page_sizes=(1,)))
    assert len(configs) > 100
    for cfg in configs:
        assert config_violations(cfg.model, cfg.server) == [], cfg.label()


def test_the_prover_uses_the_backend_model_registry_and_guards():
    assert D.MODELS is MODELS
    from spec.model.guards import BUILTIN_GUARDS

    assert D.GUARDS == BUILTIN_GUARDS
