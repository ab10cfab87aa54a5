"""The matching rules, as pure functions: requirements, workers, and the reasons a job cannot run."""

from __future__ import annotations

import pytest

from gpulayer import GPU, InvalidJobSpec, Requirements, WorkerInfo
from gpulayer.machines import this_machine
from gpulayer.models import QueueSpec, validated
from gpulayer.placement import CODES, NO_WORKERS, check, eligible_gpus, memory_text, plan
from gpulayer.worker.queues import ServedQueues

GiB = 2**30


def gpu(index: int, name: str = "NVIDIA A100-SXM4-80GB", memory_gib: int = 80, kind: str = "cuda") -> GPU:
    return GPU(index=index, kind=kind, name=name, uuid=f"GPU-{name}-{index}", memory_total=memory_gib * GiB)


def worker(name: str = "box-a", gpus: list[GPU] | None = None, **fields: object) -> WorkerInfo:
    defaults: dict[str, object] = {"host": "h", "pid": 1, "state": "idle", "slots": 4, "memory": 64 * GiB}
    return WorkerInfo(name=name, gpus=gpus or [], **{**defaults, **fields})  # type: ignore[arg-type]


def needs(**fields: object) -> Requirements:
    return validated(Requirements, fields)


# --- requirements ---------------------------------------------------------------------------------


def test_a_job_that_asks_for_nothing_is_a_one_slot_cpu_job_in_the_default_queue() -> None:
    requirements = needs()
    assert (requirements.accelerator, requirements.gpus, requirements.cpus) == ("cpu", 0, 1)
    assert requirements.capability == "default"


def test_asking_for_cuda_means_one_gpu_and_no_cpu_slot() -> None:
    requirements = needs(accelerator="cuda")
    assert (requirements.gpus, requirements.cpus) == (1, 0)


def test_asking_for_gpus_alone_takes_any_kind_of_gpu() -> None:
    assert needs(gpus=2).accelerator == "any"
    assert needs(gpu_memory="24GB").gpus == 1


def test_two_ways_of_asking_for_the_same_thing_share_a_queue() -> None:
    a = needs(gpus=1, gpu_memory="24GB", frameworks=["Torch>=2.1", "numpy"], labels={"zone": "eu", "a": "b"})
    b = needs(
        accelerator="any",
        gpu_memory=24 * 10**9,
        frameworks=["numpy", "torch >= 2.1"],
        labels={"a": "b", "zone": "eu"},
    )
    assert a == b
    assert a.capability == b.capability
    assert a.capability.startswith("any-1gpu-")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"accelerator": "cpu", "gpus": 1}, "a cpu job cannot ask for GPUs"),
        ({"accelerator": "mps", "gpus": 2}, "one mps device"),
        ({"gpus": 0, "gpu_name": "A100"}, "needs at least one GPU"),
        ({"gpu_memory": "lots"}, "not a size"),
        ({"gpu_name": "A100("}, "is not a regular expression"),
        ({"frameworks": ["torch @ https://example.invalid/t.whl"]}, "only a name and a version range"),
        ({"frameworks": ["torch>=="]}, "is not a requirement"),
        ({"frameworks": [1.5]}, "frameworks.0: Input should be a valid string"),
        ({"frameworks": 3}, "frameworks: Input should be a valid tuple"),
        ({"labels": {"bad key": "x"}}, "label name"),
    ],
)
def test_invalid_requirements_are_one_line_errors(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidJobSpec, match=message):
        needs(**fields)


# --- never ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requirements", "box", "reason"),
    [
        (dict(accelerator="cuda"), worker(), "needs cuda, has no GPU"),
        (dict(gpus=1), worker(), "needs a GPU, has no GPU"),
        (dict(accelerator="cuda"), worker(gpus=[gpu(0, "Apple M2", 32, "mps")]), "needs cuda, has mps only"),
        (dict(accelerator="mps"), worker(gpus=[gpu(0)]), "needs mps, has cuda only"),
        (dict(gpus=4), worker(gpus=[gpu(0), gpu(1)]), "needs 4 GPUs, has 2"),
        (
            dict(gpus=1, gpu_memory="40GB"),
            worker(gpus=[gpu(0, "NVIDIA RTX 4090", 24)]),
            "needs 40 GB per GPU, largest is 24 GiB",
        ),
        (
            dict(gpus=1, gpu_name="H100"),
            worker(gpus=[gpu(0)]),
            "needs 1 GPU(s) named like 'H100', has 0 (NVIDIA A100-SXM4-80GB)",
        ),
        (dict(frameworks=["torch>=2.1"]), worker(), "needs torch>=2.1, which is not installed"),
        (
            dict(frameworks=["torch>=2.1"]),
            worker(frameworks={"torch": "2.0.1"}),
            "needs torch>=2.1, has torch 2.0.1",
        ),
        (dict(labels={"zone": "eu"}), worker(), "needs label zone=eu, has no label zone"),
        (dict(labels={"zone": "eu"}), worker(labels={"zone": "us"}), "needs label zone=eu, has zone=us"),
        (dict(cpus=8), worker(slots=4), "needs 8 CPU slots, has 4"),
        (dict(memory="128GiB"), worker(memory=64 * GiB), "needs 128.0 GiB of memory, has 64.0 GiB"),
    ],
)
def test_each_way_a_worker_can_never_run_a_job_has_its_reason(
    requirements: dict[str, object], box: WorkerInfo, reason: str
) -> None:
    fit = check(needs(**requirements), box)
    assert fit.status == "never"
    assert fit.reasons == (reason,)


def test_a_framework_within_range_and_a_matching_label_fit() -> None:
    box = worker(frameworks={"torch": "2.3.0+cu121"}, labels={"zone": "eu"})
    assert check(needs(frameworks=["torch>=2.1,<3"], labels={"zone": "eu"}), box).status == "fits"


def test_a_name_pattern_is_a_case_insensitive_search() -> None:
    box = worker(gpus=[gpu(0, "NVIDIA H100 80GB HBM3"), gpu(1, "NVIDIA RTX 4090", 24)])
    assert [g.index for g in eligible_gpus(needs(gpus=1, gpu_name="a100|h100"), box.gpus)] == [0]


# --- busy -------------------------------------------------------------------------------------------


def test_a_worker_whose_gpus_are_held_is_busy_not_unable() -> None:
    box = worker(gpus=[gpu(i) for i in range(4)])
    box.gpus_busy = [g.uuid for g in box.gpus]
    assert check(needs(gpus=1), box).reasons == ("all 4 GPUs busy",)
    box.gpus_busy = box.gpus_busy[:3]
    assert check(needs(gpus=2), box).reasons == ("needs 2 GPUs, 1 of 4 free",)
    assert check(needs(gpus=1), box).status == "fits"


def test_cpu_slots_and_memory_held_by_other_jobs_make_it_busy() -> None:
    box = worker(slots=4, cpus_used=3, memory=16 * GiB, memory_used=12 * GiB)
    assert check(needs(cpus=2), box).reasons == ("3 of 4 CPU slots busy, needs 2",)
    assert check(needs(memory="8GiB"), box).reasons == ("needs 8.0 GiB of memory, 4.0 GiB free",)


def test_each_reason_carries_a_code_a_program_can_act_on() -> None:
    cpu_box = worker(slots=4, cpus_used=3, memory=16 * GiB, memory_used=12 * GiB)
    small = worker(gpus=[gpu(0, "NVIDIA RTX 4090", 24)])
    held = worker(gpus=[gpu(0)])
    held.gpus_busy = [held.gpus[0].uuid]
    cases = [
        (needs(gpus=1), cpu_box, ("no_gpu",)),
        (needs(gpus=1, gpu_memory="40GB"), small, ("gpu_memory",)),
        (needs(gpus=1, gpu_name="H100"), small, ("gpu_name",)),
        (needs(cpus=8, labels={"zone": "eu"}), cpu_box, ("cpus", "label")),
        (needs(frameworks=["torch>=2.1"]), cpu_box, ("framework",)),
        (needs(gpus=1), held, ("gpus_busy",)),
        (needs(cpus=2, memory="8GiB"), cpu_box, ("cpus_busy", "memory_busy")),
    ]
    for requirements, box, codes in cases:
        fit = check(requirements, box)
        assert fit.codes == codes, fit
        assert len(fit.codes) == len(fit.reasons)
        assert set(fit.codes) <= set(CODES)
    assert [reason.codes for reason in plan(needs(), []).reasons] == [["no_workers"]]
    gang = plan(needs(gpus=1), [held, small], nodes=2)
    assert gang.reasons[0].codes == ["gang"]
    assert [reason.codes for reason in gang.reasons[1:]] == [["gpus_busy"]]


def test_a_target_is_decided_by_the_machine_a_worker_says_it_is_on_not_its_host_name() -> None:
    here = this_machine()
    elsewhere = "0" * 32
    # Two machines may share a host name (cloned images, "localhost"): it decides nothing.
    mine, theirs = worker("mine", host="h", machine=here), worker("theirs", host="h", machine=elsewhere)
    older = worker("older", host="h")
    local, remote = needs(target="local"), needs(target="remote")
    assert local.machine == remote.machine == here  # the submitter's, filled in at submit
    assert local.capability != remote.capability != needs().capability  # each a queue of its own
    assert plan(local, [mine, theirs, older]).worker == "mine"
    assert plan(remote, [mine, theirs, older]).worker == "theirs"
    assert [(r.worker, r.reason, r.codes) for r in plan(local, [theirs, older]).reasons] == [
        ("older", "target local: it does not say which machine it is on (an older worker)", ["target"]),
        ("theirs", "target local: it is on another machine than the submitter", ["target"]),
    ]
    refused = plan(remote, [mine])
    assert refused.schedulable is False
    assert refused.lines() == [
        "no connected worker could ever run this job:",
        "  mine: target remote: it is on the same machine as the submitter",
    ]
    assert check(needs(), older).status == "fits"  # any: wherever


def test_a_machine_goes_with_a_target_and_is_the_submitters_unless_given() -> None:
    assert needs(target="local", machine="a" * 32).machine == "a" * 32
    assert needs(target="any").machine is None
    with pytest.raises(InvalidJobSpec, match="a machine goes with target local or remote only"):
        needs(machine="a" * 32)


# --- plans ------------------------------------------------------------------------------------------


def test_with_no_workers_the_reason_says_so() -> None:
    result = plan(needs(), [])
    assert (result.worker, result.schedulable) == (None, False)
    assert [(r.worker, r.reason) for r in result.reasons] == [(None, NO_WORKERS)]


def test_the_least_busy_fitting_worker_is_chosen() -> None:
    busy, idle = worker("busy", slots=4, cpus_used=3), worker("idle", slots=4)
    assert plan(needs(), [busy, idle]).worker == "idle"


def test_busy_workers_make_a_job_wait_unable_ones_make_it_unschedulable() -> None:
    gpu_box = worker("gpu-box", gpus=[gpu(0)], gpus_busy=[gpu(0).uuid])
    cpu_box = worker("cpu-box")
    waiting = plan(needs(gpus=1), [gpu_box, cpu_box])
    assert (waiting.worker, waiting.schedulable) == (None, True)
    assert {(r.worker, r.reason) for r in waiting.reasons} == {
        ("gpu-box", "its GPU is busy"),
        ("cpu-box", "needs a GPU, has no GPU"),
    }
    never = plan(needs(gpus=2), [gpu_box, cpu_box])
    assert never.schedulable is False


def test_gpu_memory_reads_as_it_was_given() -> None:
    assert memory_text(24 * 10**9) == "24 GB"
    assert memory_text(80 * GiB) == "80 GiB"
    assert memory_text(25_000_000_001) == "23.3 GiB"


# --- gang jobs ------------------------------------------------------------------------------------


def test_a_gang_job_starts_on_the_least_busy_workers_that_each_fit_one_node() -> None:
    boxes = [worker("a", slots=4, cpus_used=2), worker("b", slots=4), worker("c", slots=4, cpus_used=1)]
    result = plan(needs(cpus=2), boxes, nodes=2)
    assert (result.worker, result.workers, result.schedulable) == ("b", ["b", "c"], True)


def test_a_gang_job_waits_when_too_few_workers_fit_now_and_says_why() -> None:
    boxes = [worker("a", slots=2, cpus_used=1), worker("b", slots=2)]
    result = plan(needs(cpus=2), boxes, nodes=2)
    assert (result.worker, result.workers, result.schedulable) == (None, [], True)
    assert result.reasons[0].worker is None
    assert result.reasons[0].reason == "needs 2 workers that can each hold one node: 2 could ever, 1 can now"
    assert (result.reasons[1].worker, result.reasons[1].reason) == ("a", "1 of 2 CPU slots busy, needs 2")


def test_a_gang_job_no_set_of_workers_could_hold_is_unschedulable() -> None:
    boxes = [worker("gpu-box", gpus=[gpu(0), gpu(1)]), worker("cpu-box")]
    result = plan(needs(gpus=2), boxes, nodes=2)
    assert result.schedulable is False
    assert result.reasons[0].reason == "needs 2 workers that can each hold one node: 1 could ever, 1 can now"


# --- the queues a worker serves ------------------------------------------------------------------


def test_queues_of_equal_priority_take_turns_and_a_higher_priority_comes_first() -> None:
    served = ServedQueues(worker(), interval=60)
    registry = {
        "a": QueueSpec(requirements=needs(memory="1KB")),
        "b": QueueSpec(requirements=needs(memory="2KB")),
        "urgent": QueueSpec(requirements=needs(memory="3KB"), priority=5),
        "huge": QueueSpec(requirements=needs(gpus=8)),
    }
    assert served.update(lambda: registry)
    assert served.names == ["a", "b", "urgent"]  # never a queue it cannot run
    orders = [[offer.name for offer in served.claim_order()] for _ in range(3)]
    assert orders == [["urgent", "a", "b"], ["urgent", "b", "a"], ["urgent", "a", "b"]]


def test_a_queue_announced_while_the_registry_is_read_is_looked_for_again() -> None:
    served = ServedQueues(worker(), interval=60)
    assert served.due
    assert not served.update(dict)
    assert not served.due  # until the interval passes or a queue is announced
    served.look_soon()
    assert served.due

    def read_during_an_announcement() -> dict[str, QueueSpec]:
        served.look_soon()
        return {}

    served.update(read_during_an_announcement)
    assert served.due
    assert served.update(lambda: {"late": QueueSpec()})
    assert not served.update(lambda: {"late": QueueSpec()})  # seen already
