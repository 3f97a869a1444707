"""A test executor: each step runs on the calling thread before ``execute_model`` returns. It cannot overlap
anything, so it declares no async support; selecting it (``executor_backend="inline"``, registered on import)
shows the async contract refusing an incapable component."""

from __future__ import annotations

from concurrent.futures import Future

from tandem.core.interface import ModelRunnerOutput, SchedulerOutput
from tandem.executor import Executor, register_executor
from tandem.model.loader import Checkpoint
from tandem.trace.tracer import NULL_TRACER, Tracer
from tandem.worker.model_runner import ModelRunner
from tandem.worker.worker import WorkerSpec, build_runner


@register_executor
class InlineExecutor(Executor):
    """Runs each step on the calling thread before returning. It cannot overlap anything, so it
    declares no async support: selecting it shows the async contract at work."""

    name = "inline"
    SUPPORTS_ASYNC_SCHEDULING = False
    ASYNC_FIX = "use executor_backend 'uni' or 'mp' (the inline executor runs each step to completion)"

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    @classmethod
    def create(
        cls, spec: WorkerSpec, *, checkpoint: Checkpoint | None = None, tracer: Tracer = NULL_TRACER
    ) -> InlineExecutor:
        return cls(build_runner(spec, checkpoint, tracer=tracer))

    def execute_model(self, scheduler_output: SchedulerOutput) -> Future[ModelRunnerOutput]:
        fut: Future[ModelRunnerOutput] = Future()
        try:
            fut.set_result(self.runner.execute_model(scheduler_output).materialize())
        except Exception as exc:
            fut.set_exception(exc)
        return fut
