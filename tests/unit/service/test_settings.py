"""Settings: environment, config file, precedence, and one clear paragraph per invalid value."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pipeline.lingbot.models.attention import AttentionPlan
from service.cli import main
from service.config_records import ServiceConfig
from service.errors import SettingsError
from service.settings import Settings, load_settings
from service.transports import embedded_config, livekit_config
from service.workers import WorkerOptions, allocator_environment, attention_plan, lingbot_fast_options, worker_options


def test_defaults_bind_loopback_and_match_the_documented_contract() -> None:
    settings = load_settings()
    assert settings.host == "127.0.0.1"
    assert (settings.port, settings.num_workers, settings.max_sessions_per_worker, settings.queue_size) == (
        8080,
        1,
        1,
        16,
    )
    assert settings.drain_timeout == 60.0
    assert settings.admission_backend == "memory"
    assert settings.cors_origins == ()
    assert settings.api_key_list == ()
    assert not settings.livekit_enabled


def test_api_keys_make_the_default_bind_every_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINGSTREAM_API_KEYS", "alpha-key-0123456789, beta-key-0123456789 ,")
    settings = load_settings()
    assert settings.host == "0.0.0.0"
    assert settings.api_key_list == ("alpha-key-0123456789", "beta-key-0123456789")
    assert "alpha" not in repr(settings)


def test_comma_separated_lists_are_plain_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINGSTREAM_CORS_ORIGINS", "https://a.example, http://localhost:3000/")
    assert load_settings().cors_origins == ("https://a.example", "http://localhost:3000")


def test_livekit_variables_are_read_without_the_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIVEKIT_URL", "wss://lk.example")
    monkeypatch.setenv("LIVEKIT_API_KEY", "APIkey")
    monkeypatch.setenv("LIVEKIT_API_SECRET", "s3cret")
    settings = load_settings()
    assert settings.livekit_enabled
    assert settings.livekit_api_secret is not None
    assert settings.livekit_api_secret.get_secret_value() == "s3cret"


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_config_file_is_read_and_the_environment_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    values = {"PORT": 9001, "queue_size": 3, "cors_origins": ["https://a.example"], "LIVEKIT_URL": "wss://x.example"}
    path = tmp_path / f"settings{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(values))
    else:
        path.write_text("PORT: 9001\nqueue_size: 3\ncors_origins: [https://a.example]\nLIVEKIT_URL: wss://x.example\n")
    monkeypatch.setenv("LINGSTREAM_CONFIG_FILE", str(path))
    monkeypatch.setenv("LINGSTREAM_QUEUE_SIZE", "5")
    monkeypatch.setenv("LIVEKIT_API_KEY", "k")
    monkeypatch.setenv("LIVEKIT_API_SECRET", "s")
    settings = load_settings()
    assert settings.port == 9001
    assert settings.queue_size == 5
    assert settings.cors_origins == ("https://a.example",)
    assert settings.livekit_url == "wss://x.example"


def test_overrides_beat_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINGSTREAM_PORT", "9000")
    assert load_settings(port=9100, host=None).port == 9100


def test_unknown_config_file_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text('{"queue_sise": 3}')
    with pytest.raises(SettingsError, match="unknown setting 'queue_sise'"):
        load_settings(config_file=path)


def test_config_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read the config file"):
        load_settings(config_file=tmp_path / "missing.yaml")
    bad = tmp_path / "settings.toml"
    bad.write_text("port = 1")
    with pytest.raises(SettingsError, match=r"must end in \.json, \.yaml or \.yml"):
        load_settings(config_file=bad)
    broken = tmp_path / "settings.json"
    broken.write_text("{not json")
    with pytest.raises(SettingsError, match="is not valid JSON"):
        load_settings(config_file=broken)


INVALID = [
    ("LINGSTREAM_PORT", "http", "LINGSTREAM_PORT"),
    ("LINGSTREAM_PORT", "70000", "LINGSTREAM_PORT"),
    ("LINGSTREAM_HOST", "not a host!", "LINGSTREAM_HOST"),
    ("LINGSTREAM_NUM_WORKERS", "0", "LINGSTREAM_NUM_WORKERS"),
    ("LINGSTREAM_MAX_SESSIONS_PER_WORKER", "0", "LINGSTREAM_MAX_SESSIONS_PER_WORKER"),
    ("LINGSTREAM_QUEUE_SIZE", "-1", "LINGSTREAM_QUEUE_SIZE"),
    ("LINGSTREAM_QUEUE_TIMEOUT", "0", "LINGSTREAM_QUEUE_TIMEOUT"),
    ("LINGSTREAM_QUEUE_HEARTBEAT_TIMEOUT", "soon", "LINGSTREAM_QUEUE_HEARTBEAT_TIMEOUT"),
    ("LINGSTREAM_DRAIN_TIMEOUT", "-5", "LINGSTREAM_DRAIN_TIMEOUT"),
    ("LINGSTREAM_API_KEYS", "good-key,bad key", "LINGSTREAM_API_KEYS"),
    ("LINGSTREAM_CORS_ORIGINS", "example.com", "LINGSTREAM_CORS_ORIGINS"),
    ("LINGSTREAM_LOG_FORMAT", "xml", "LINGSTREAM_LOG_FORMAT"),
    ("LINGSTREAM_LOG_LEVEL", "LOUD", "LINGSTREAM_LOG_LEVEL"),
    ("LINGSTREAM_TORCH_THREADS", "0", "LINGSTREAM_TORCH_THREADS"),
    ("LINGSTREAM_DEVICE", "tpu", "LINGSTREAM_DEVICE"),
    ("LINGSTREAM_RECONNECT_GRACE", "-1", "LINGSTREAM_RECONNECT_GRACE"),
    ("LINGSTREAM_VIDEO_CODEC", "av1", "LINGSTREAM_VIDEO_CODEC"),
    ("LINGSTREAM_VIDEO_BITRATE", "10", "LINGSTREAM_VIDEO_BITRATE"),
    ("LINGSTREAM_ADMISSION_BACKEND", "redis", "LINGSTREAM_ADMISSION_BACKEND"),
    ("LINGSTREAM_ADMISSION_BACKEND", "etcd", "LINGSTREAM_ADMISSION_BACKEND"),
    ("LINGSTREAM_MAX_REQUEST_BYTES", "12", "LINGSTREAM_MAX_REQUEST_BYTES"),
    ("LINGSTREAM_MAX_REQUEST_BYTES", "2048", "LINGSTREAM_MAX_IMAGE_BYTES"),
    ("LINGSTREAM_MAX_IMAGE_BYTES", "0", "LINGSTREAM_MAX_IMAGE_BYTES"),
    ("LINGSTREAM_MAX_IMAGE_PIXELS", "many", "LINGSTREAM_MAX_IMAGE_PIXELS"),
    ("LINGSTREAM_SESSION_HISTORY", "0", "LINGSTREAM_SESSION_HISTORY"),
    ("LINGSTREAM_MAX_CONNECTIONS", "0", "LINGSTREAM_MAX_CONNECTIONS"),
    ("LINGSTREAM_MALLOC_ARENAS", "-1", "LINGSTREAM_MALLOC_ARENAS"),
    ("LINGSTREAM_IDLE_FRAME_INTERVAL_MS", "-1", "LINGSTREAM_IDLE_FRAME_INTERVAL_MS"),
    ("LINGSTREAM_IDLE_FRAME_INTERVAL_MS", "0.5", "LINGSTREAM_IDLE_FRAME_INTERVAL_MS"),
    ("LINGSTREAM_MODEL", "lingbot-slow", "LINGSTREAM_MODEL"),
    ("LINGSTREAM_MODEL", "lingbot-fast", "LINGSTREAM_MODEL_PATH"),
    ("LINGSTREAM_MODEL_DTYPE", "int8", "LINGSTREAM_MODEL_DTYPE"),
    ("LINGSTREAM_MODEL_WINDOW_FRAMES", "2", "LINGSTREAM_MODEL_WINDOW_FRAMES"),
    ("LINGSTREAM_MODEL_SINK_FRAMES", "-1", "LINGSTREAM_MODEL_SINK_FRAMES"),
    ("LINGSTREAM_COMPILE", "fast", "LINGSTREAM_COMPILE"),
    ("LINGSTREAM_COMPILE", "max", "LINGSTREAM_COMPILE=max compiles the lingbot-fast DiT"),
    ("LINGSTREAM_ATTENTION", "xformers", "LINGSTREAM_ATTENTION"),
    ("LINGSTREAM_ATTENTION", "cudnn", "LINGSTREAM_ATTENTION and LINGSTREAM_WARMUP_CHUNKS are for the lingbot-fast"),
    ("LINGSTREAM_WARMUP_CHUNKS", "-1", "LINGSTREAM_WARMUP_CHUNKS"),
    ("LINGSTREAM_WARMUP_CHUNKS", "2", "LINGSTREAM_ATTENTION and LINGSTREAM_WARMUP_CHUNKS are for the lingbot-fast"),
    ("LINGSTREAM_DECODER", "taehv", "LINGSTREAM_DECODER"),
    ("LINGSTREAM_DECODER", "tiny", "LINGSTREAM_DECODER=tiny chooses lingbot-fast's decoder"),
    ("LINGSTREAM_REPLICA_URL", "10.0.3.7:8000", "LINGSTREAM_REPLICA_URL"),
    ("LINGSTREAM_REPLICA_URL", "http://10.0.3.7:8000/v1", "LINGSTREAM_REPLICA_URL"),
    ("LINGSTREAM_REPLICA_URL", "http://10.0.3.7:8000", "LINGSTREAM_REPLICA_URL needs LINGSTREAM_ADMISSION_BACKEND"),
    ("LIVEKIT_URL", "ftp://lk.example", "LIVEKIT_URL"),
    ("LIVEKIT_URL", "wss://lk.example", "LIVEKIT_API_KEY"),
]


@pytest.mark.parametrize(("variable", "value", "named"), INVALID, ids=[f"{v}={x}" for v, x, _ in INVALID])
def test_every_invalid_value_stops_the_start_with_a_clear_message(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, named: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert named in message
    assert message.startswith("invalid configuration: ")
    assert "\n" not in message


def test_secrets_never_appear_in_error_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINGSTREAM_API_KEYS", "secret-one,secret two")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert "secret" not in str(caught.value).replace("LINGSTREAM_API_KEYS", "")


def test_cli_prints_one_paragraph_and_exits_2_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LINGSTREAM_QUEUE_SIZE", "lots")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "LINGSTREAM_QUEUE_SIZE" in err
    assert "Traceback" not in err
    assert err.count("\n") == 1


def test_cli_refuses_the_worker_factory_hook_without_the_test_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--worker-factory", "tests.support.fakes.world:idle_fake_workers"]) == 2
    assert "LINGSTREAM_TEST_HOOKS=1" in capsys.readouterr().err


def test_settings_convert_once_into_the_packages_records(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINGSTREAM_NUM_WORKERS", "2")
    monkeypatch.setenv("LINGSTREAM_MAX_SESSIONS_PER_WORKER", "2")
    monkeypatch.setenv("LINGSTREAM_QUEUE_SIZE", "0")
    monkeypatch.setenv("LINGSTREAM_API_KEYS", "k1-0123456789abcdef")
    monkeypatch.setenv("LINGSTREAM_SESSION_HISTORY", "7")
    settings = load_settings()
    config = ServiceConfig.from_settings(settings)
    assert (config.session_history, config.admission.finished_history) == (7, 7)
    assert {options.session_history for options in worker_options(settings)} == {7}
    assert config.admission.capacity == 4
    assert config.admission.queue_size == 0
    assert len(config.api_key_digests) == 1
    assert b"k1-0123456789abcdef" not in config.api_key_digests[0]
    assert isinstance(Settings.model_fields["api_keys"].default.get_secret_value(), str)


def test_the_idle_frame_interval_reaches_both_transports_in_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIVEKIT_URL", "wss://lk.example")
    monkeypatch.setenv("LIVEKIT_API_KEY", "k")
    monkeypatch.setenv("LIVEKIT_API_SECRET", "s")
    default = load_settings()  # unset: keep-warm on LiveKit, off on the embedded transport
    assert (livekit_config(default).idle_frame_interval, embedded_config(default).idle_frame_interval) == (0.1, 0.0)
    monkeypatch.setenv("LINGSTREAM_IDLE_FRAME_INTERVAL_MS", "400")
    settings = load_settings()
    assert embedded_config(settings).idle_frame_interval == 0.4
    assert livekit_config(settings).idle_frame_interval == 0.4
    monkeypatch.setenv("LINGSTREAM_IDLE_FRAME_INTERVAL_MS", "0")  # off
    assert livekit_config(load_settings()).idle_frame_interval == 0.0


def test_browsers_get_the_client_url_and_the_service_dials_livekit_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIVEKIT_URL", "ws://livekit:7880")
    monkeypatch.setenv("LIVEKIT_API_KEY", "k")
    monkeypatch.setenv("LIVEKIT_API_SECRET", "s")
    alone = livekit_config(load_settings())
    assert (alone.url, alone.join_url) == ("ws://livekit:7880", "ws://livekit:7880")
    monkeypatch.setenv("LINGSTREAM_LIVEKIT_CLIENT_URL", "ws://localhost:7880")
    both = livekit_config(load_settings())
    assert (both.url, both.join_url) == ("ws://livekit:7880", "ws://localhost:7880")
    monkeypatch.setenv("LINGSTREAM_LIVEKIT_CLIENT_URL", "ftp://localhost")
    with pytest.raises(SettingsError, match="LINGSTREAM_LIVEKIT_CLIENT_URL"):
        load_settings()


def test_session_rooms_hold_the_controller_the_service_and_every_viewer_place(monkeypatch: pytest.MonkeyPatch) -> None:
    # The service participant (kind agent) is not counted by the server: max_participants is controller + viewers.
    monkeypatch.setenv("LIVEKIT_URL", "wss://lk.example")
    monkeypatch.setenv("LIVEKIT_API_KEY", "k")
    monkeypatch.setenv("LIVEKIT_API_SECRET", "s")
    assert livekit_config(load_settings()).room.max_participants == 1 + 8  # the default LINGSTREAM_MAX_VIEWERS
    monkeypatch.setenv("LINGSTREAM_MAX_VIEWERS", "30")
    assert livekit_config(load_settings()).room.max_participants == 31
    monkeypatch.setenv("LINGSTREAM_MAX_VIEWERS", "0")
    assert livekit_config(load_settings()).room.max_participants == 1


def test_a_recordings_directory_that_cannot_be_written_stops_the_start_naming_the_variable(tmp_path: Path) -> None:
    made = tmp_path / "new" / "recordings"
    config = ServiceConfig.from_settings(load_settings(recordings_dir=made))
    assert config.recordings is not None
    assert config.recordings.directory == made
    assert made.is_dir()
    assert ServiceConfig.from_settings(load_settings()).recordings is None
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(SettingsError, match=r"LINGSTREAM_RECORDINGS_DIR=.*a-file/recordings cannot be created"):
        ServiceConfig.from_settings(load_settings(recordings_dir=blocker / "recordings"))
    with pytest.raises(SettingsError, match=r"LINGSTREAM_RECORDINGS_DIR=.*is not a directory"):
        ServiceConfig.from_settings(load_settings(recordings_dir=blocker))


def test_lingbot_fast_settings_are_read_and_checked_together(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LINGSTREAM_MODEL", "LingBot-Fast")
    monkeypatch.setenv("LINGSTREAM_MODEL_PATH", str(tmp_path))
    monkeypatch.setenv("LINGSTREAM_MODEL_DTYPE", "BFloat16")
    settings = load_settings()
    assert (settings.model, settings.model_path, settings.model_dtype) == ("lingbot-fast", tmp_path, "bfloat16")
    assert (settings.model_window_frames, settings.model_sink_frames) == (18, 6)
    assert settings.compile == "off"
    monkeypatch.setenv("LINGSTREAM_COMPILE", "max")
    options = worker_options(load_settings())[0]
    assert lingbot_fast_options(options).compile == "max"  # what load_denoiser compiles the DiT's blocks with
    assert lingbot_fast_options(options).warm_up_chunks() == 7  # compiling: the window filled, one chunk more
    assert attention_plan(options) == AttentionPlan("sdpa")  # the CPU: PyTorch's own SDPA choice
    monkeypatch.setenv("LINGSTREAM_ATTENTION", "math")
    monkeypatch.setenv("LINGSTREAM_WARMUP_CHUNKS", "3")
    options = worker_options(load_settings())[0]
    assert (lingbot_fast_options(options).attention, lingbot_fast_options(options).warm_up_chunks()) == ("math", 3)
    monkeypatch.setenv("LINGSTREAM_ATTENTION", "cudnn")
    with pytest.raises(SettingsError, match="LINGSTREAM_ATTENTION=cudnn: attention cudnn runs on CUDA devices only"):
        attention_plan(worker_options(load_settings())[0])
    monkeypatch.delenv("LINGSTREAM_ATTENTION")
    monkeypatch.delenv("LINGSTREAM_WARMUP_CHUNKS")
    assert lingbot_fast_options(options).decoder == "wan"  # the Wan VAE by default
    monkeypatch.setenv("LINGSTREAM_DECODER", "tiny")
    assert lingbot_fast_options(worker_options(load_settings())[0]).decoder == "tiny"
    monkeypatch.setenv("LINGSTREAM_MODEL_SINK_FRAMES", "16")
    with pytest.raises(SettingsError, match=r"LINGSTREAM_MODEL_SINK_FRAMES \(16\) \+ a chunk of 3"):
        load_settings()
    monkeypatch.setenv("LINGSTREAM_MODEL_SINK_FRAMES", "6")
    monkeypatch.setenv("LINGSTREAM_STAGE_PLACEMENT", "processes")
    monkeypatch.setenv("LINGSTREAM_DENOISE_RANKS", "2")
    assert load_settings().denoise_ranks == 2  # Ulysses context parallelism: the heads rule is checked at start


def test_expandable_segments_are_set_for_cuda_threads_workers_unless_the_environment_chose() -> None:
    cpu = WorkerOptions(0, 1, 1, "cpu", None, 1, 1)
    gpu = dataclasses.replace(cpu, device="cuda:0", devices=("cuda:0",))
    processes = dataclasses.replace(gpu, stage_placement="processes")
    assert allocator_environment([gpu], {}) == {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    assert allocator_environment([cpu], {}) == {}
    assert allocator_environment([gpu, processes], {}) == {}  # latents cross groups by CUDA IPC
    assert allocator_environment([gpu], {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}) == {}
    assert allocator_environment([gpu], {"PYTORCH_ALLOC_CONF": "expandable_segments:False"}) == {}


def test_the_replica_url_is_this_replicas_address_for_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINGSTREAM_ADMISSION_BACKEND", "redis")
    monkeypatch.setenv("LINGSTREAM_REDIS_URL", "redis://redis:6379/0")
    shared = ServiceConfig.from_settings(load_settings()).shared_admission
    assert shared is not None
    assert shared.replica_url is None  # unset: transport routes of sessions run elsewhere answer 409
    monkeypatch.setenv("LINGSTREAM_REPLICA_URL", " http://10.0.3.7:8000/ ")
    shared = ServiceConfig.from_settings(load_settings()).shared_admission
    assert shared is not None
    assert shared.replica_url == "http://10.0.3.7:8000"
