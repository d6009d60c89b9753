"""Stage timings that are true on a GPU (`pipeline/lingbot/stage_timer.py`): CUDA events for a part on a CUDA
device, host time elsewhere, chosen from the part's device; the event span's arithmetic and order; and the graph's
denoise and decode stages reporting their timer's seconds as the chunk's `denoise` and `decode` timings (which the
OTel and metrics series read). No GPU: the CUDA side is driven through the `DeviceEvent` seam."""

from __future__ import annotations

import torch

from pipeline.actor import StageCall
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.graph.stages import (
    CONDITION_REQUEST,
    CONTROL,
    FRAMES,
    ConditionRequest,
    ControlArtifact,
    DecodeStage,
    DenoiseStage,
    EncodeStage,
    FramesArtifact,
)
from pipeline.lingbot.reference.model import ReferenceWorldModel
from pipeline.lingbot.stage_timer import (
    CudaEventTimer,
    DeviceBound,
    DeviceEvent,
    HostTimer,
    RunningSpan,
    stage_timer,
    timer_for,
)

CONFIG = LingBotSessionConfig(width=64, height=32, frame_num=4 * 6 - 3, seed=3)


class _Stream:
    """A device stream's clock in milliseconds: work enqueued advances `launched`; `done` follows on sync."""

    def __init__(self) -> None:
        self.launched = 0.0
        self.log: list[str] = []


class _Event:
    def __init__(self, stream: _Stream) -> None:
        self._stream = stream
        self.at: float | None = None
        self.reached = False

    def record(self) -> None:
        self.at = self._stream.launched
        self._stream.log.append("record")

    def synchronize(self) -> None:
        self.reached = True
        self._stream.log.append("synchronize")

    def elapsed_time(self, end: DeviceEvent) -> float:
        assert isinstance(end, _Event)
        # CUDA refuses the time to an event the stream has not reached: so must the timer never ask for it.
        assert end.reached, "elapsed_time read before the end event was synchronized"
        assert self.at is not None
        assert end.at is not None
        return end.at - self.at


class _Part:
    def __init__(self, device: str) -> None:
        self._device = torch.device(device)

    @property
    def device(self) -> torch.device:
        return self._device


def test_a_part_on_a_cuda_device_is_timed_with_events_on_that_device_and_every_other_with_host_time() -> None:
    timer = stage_timer("cuda:1")  # chosen without touching CUDA (this machine may have none)
    assert isinstance(timer, CudaEventTimer)
    assert timer.device == torch.device("cuda:1")
    assert isinstance(stage_timer("cpu"), HostTimer)
    assert isinstance(stage_timer(torch.device("meta")), HostTimer)
    assert isinstance(_Part("cuda:0"), DeviceBound)
    assert isinstance(timer_for(_Part("cuda:0")), CudaEventTimer)
    assert isinstance(timer_for(_Part("cpu")), HostTimer)
    assert isinstance(timer_for(object()), HostTimer)  # a part that names no device: host time, as before
    reference = ReferenceWorldModel("cpu")
    assert isinstance(timer_for(reference.denoiser), HostTimer)
    assert isinstance(timer_for(reference.decoder), HostTimer)


def test_an_event_span_is_the_streams_time_between_its_events_read_after_waiting_for_the_end() -> None:
    stream = _Stream()
    timer = CudaEventTimer(torch.device("cuda:0"), lambda: _Event(stream))
    stream.launched = 40.0  # earlier work on the stream, not the span's
    span = timer.start()
    stream.launched += 250.0  # the call's kernels: launched at once, run later on the device
    assert span.stop() == 0.25
    assert stream.log == ["record", "record", "synchronize"]


def test_host_time_measures_the_call() -> None:
    span = HostTimer().start()
    assert 0.0 <= span.stop() < 5.0


class _FixedSpan:
    def __init__(self, seconds: float, log: list[str]) -> None:
        self._seconds, self._log = seconds, log

    def stop(self) -> float:
        self._log.append("stop")
        return self._seconds


class _FixedTimer:
    """A timer whose spans last `seconds`, whatever the host clock says."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.log: list[str] = []

    def start(self) -> RunningSpan:
        self.log.append("start")
        return _FixedSpan(self.seconds, self.log)


def test_the_denoise_and_decode_stages_report_their_timers_seconds_as_the_chunks_timings() -> None:
    model = ReferenceWorldModel("cpu")
    denoise_timer, decode_timer = _FixedTimer(1.25), _FixedTimer(0.5)
    encode = EncodeStage(model.encoder)
    denoise = DenoiseStage(model.denoiser, denoise_timer)
    decode = DecodeStage(model.decoder, timer=decode_timer)
    for index in range(2):
        request = ConditionRequest(index, 3, CONFIG if index == 0 else None)
        condition = encode.process(StageCall("encode", "s", index, {CONDITION_REQUEST: request}))["condition"]
        control = ControlArtifact(index, ControlSnapshot.from_keys(index, ["w"]))
        latent = denoise.process(StageCall("denoise", "s", index, {"condition": condition, CONTROL: control}))
        frames = decode.process(StageCall("decode", "s", index, dict(latent)))[FRAMES]
        assert isinstance(frames, FramesArtifact)
        assert dict(frames.timings) == {"denoise": 1.25, "decode": 0.5}
    assert denoise_timer.log == decode_timer.log == ["start", "stop"] * 2
    for stage in (decode, denoise, encode):
        stage.release("s")
