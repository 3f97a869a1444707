"""The async_scheduling contract, cell by cell: requested False/True/None x supported / each unsupported
reason -> resolved + reason, or the error. The capability matrix comes from the components themselves."""

from __future__ import annotations

import pytest

from tandem.async_decision import (
    AsyncCapability,
    AsyncReason,
    AsyncSchedulingError,
    resolve_async_scheduling,
)
from tandem.engine.builder import async_capabilities, plan_engine
from tandem.engine.llm import config_from_kwargs
from tandem.executor import executor_classes
from tests import inline_executor  # noqa: F401  (registers executor_backend "inline")
from tandem.spec_decode.factory import proposer_classes

OK = [
    AsyncCapability("executor", "executor 'uni'", True),
    AsyncCapability("speculative", "speculative method 'ngram'", True),
]
UNSUPPORTED = {
    AsyncReason.UNSUPPORTED_EXECUTOR: AsyncCapability(
        "executor", "executor 'x'", False, AsyncReason.UNSUPPORTED_EXECUTOR, "use uni"
    ),
    AsyncReason.PIPELINE_PARALLEL: AsyncCapability(
        "pipeline_parallel", "pp=2", False, AsyncReason.PIPELINE_PARALLEL, "pp=1"
    ),
    AsyncReason.UNSUPPORTED_SPEC_METHOD: AsyncCapability(
        "speculative", "method 'y'", False, AsyncReason.UNSUPPORTED_SPEC_METHOD, "other method"
    ),
    AsyncReason.PADDED_DRAFTER_BATCH_DISABLED: AsyncCapability(
        "speculative", "padded drafter", False, AsyncReason.PADDED_DRAFTER_BATCH_DISABLED, "pad"
    ),
    AsyncReason.UNSUPPORTED_FEATURE: AsyncCapability(
        "feature", "feature z", False, AsyncReason.UNSUPPORTED_FEATURE, "drop z"
    ),
}


@pytest.mark.parametrize("requested", [False, True, None])
def test_supported(requested):
    d = resolve_async_scheduling(requested, OK, log=False)
    assert d.requested is requested
    assert d.resolved is (requested is not False)
    assert d.reason == {
        False: AsyncReason.EXPLICIT_DISABLED,
        True: AsyncReason.EXPLICIT_ENABLED,
        None: AsyncReason.COMPATIBLE_DEFAULT,
    }[requested]


@pytest.mark.parametrize("reason", list(UNSUPPORTED))
@pytest.mark.parametrize("requested", [False, True, None])
def test_unsupported(requested, reason):
    caps = OK + [UNSUPPORTED[reason]]
    if requested is True:
        with pytest.raises(AsyncSchedulingError) as err:
            resolve_async_scheduling(requested, caps, log=False)
        assert err.value.reason == reason and isinstance(err.value, ValueError)
        assert reason.value in str(err.value) and "Fix:" in str(err.value)
        return
    d = resolve_async_scheduling(requested, caps, log=False)
    assert d.resolved is False and d.requested is requested
    assert d.reason == (AsyncReason.EXPLICIT_DISABLED if requested is False else reason)


def test_check_order_names_the_first_failing_component():
    caps = [UNSUPPORTED[AsyncReason.UNSUPPORTED_FEATURE], UNSUPPORTED[AsyncReason.UNSUPPORTED_SPEC_METHOD],
            UNSUPPORTED[AsyncReason.UNSUPPORTED_EXECUTOR]]
    d = resolve_async_scheduling(None, caps, log=False)
    assert d.reason == AsyncReason.UNSUPPORTED_EXECUTOR


def test_auto_off_is_logged_once_as_warning(caplog):
    with caplog.at_level("INFO", logger="tandem.async"):
        resolve_async_scheduling(None, OK + [UNSUPPORTED[AsyncReason.UNSUPPORTED_EXECUTOR]])
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "unsupported_executor" in warnings[0].getMessage()


def test_capabilities_are_declared_by_components():
    classes = executor_classes()
    assert {"uni", "mp", "inline"} <= set(classes)
    assert classes["uni"].async_capability().supported
    assert classes["mp"].async_capability().supported
    assert not classes["inline"].async_capability().supported


@pytest.mark.parametrize("requested", [False, True, None])
def test_real_executors(requested):
    for backend, supported in (("uni", True), ("mp", True), ("inline", False)):
        config = config_from_kwargs(executor_backend=backend, async_scheduling=requested)
        if requested is True and not supported:
            with pytest.raises(AsyncSchedulingError, match="inline"):
                plan_engine(config, log=False)
            continue
        plan = plan_engine(config, log=False)
        assert plan.decision.resolved is (requested is not False and supported)
        assert config.scheduler.async_scheduling is requested  # the request is never rewritten


@pytest.mark.parametrize("method", sorted(proposer_classes()))
def test_default_resolves_on_for_every_speculative_method(method):
    """Regression (vLLM PR #48341): a method allowed when explicit must also be on by default."""
    spec = {"method": method, "num_speculative_tokens": 3}
    if method in ("draft_model",):
        spec["model"] = "smollm2-135m-instruct"
    config = config_from_kwargs(speculative_config=spec)
    caps = async_capabilities(config)
    assert any(c.kind == "speculative" for c in caps)
    plan = plan_engine(config, log=False)
    assert plan.decision.resolved and plan.decision.reason == AsyncReason.COMPATIBLE_DEFAULT
    explicit = plan_engine(config_from_kwargs(speculative_config=spec, async_scheduling=True), log=False)
    assert explicit.decision.reason == AsyncReason.EXPLICIT_ENABLED


def test_unknown_executor_is_an_error():
    with pytest.raises(ValueError, match="unknown executor_backend"):
        plan_engine(config_from_kwargs(executor_backend="nope"), log=False)
