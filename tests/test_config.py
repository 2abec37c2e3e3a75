from __future__ import annotations

import re
from pathlib import Path

import pytest

from embedx.config import Settings, load_settings, settings_table
from embedx.errors import ConfigError

CONFIGURATION = Path(__file__).parent.parent / "docs" / "configuration.md"
README = Path(__file__).parent.parent / "README.md"


def test_defaults_are_the_documented_ones() -> None:
    settings = load_settings(environ={})
    assert settings.host == "127.0.0.1"
    assert settings.port == 8477
    assert settings.max_request_items == 2048
    assert settings.max_request_bytes == 32_000_000
    assert settings.max_batch_tokens == 262144
    assert settings.default_keep_alive_s == 600
    assert settings.max_inputs_in_flight == 8192
    assert settings.request_queue_timeout_s == 30
    assert settings.max_concurrent_loads == 2
    assert settings.normalize is True
    assert settings.smoke_test_on_load is True
    assert settings.devices is None


def test_precedence_is_defaults_then_toml_then_environment_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "embedx.toml"
    config.write_text('port = 9000\nhost = "0.0.0.0"\nmax_batch_tokens = 1000\n')
    environ = {"EMBEDX_CONFIG": str(config), "EMBEDX_PORT": "9001", "EMBEDX_LOG_LEVEL": "debug"}
    settings = load_settings({"port": "9002"}, environ=environ)
    assert settings.port == 9002  # flag beats environment
    assert settings.log_level == "debug"  # environment beats default
    assert settings.host == "0.0.0.0"  # file beats default
    assert settings.max_batch_tokens == 1000
    assert load_settings(environ=environ).port == 9001  # environment beats file
    # a keyword of None (Embedder(..., wrapping=None)) is a value too: no wrapping
    environ = {"EMBEDX_WRAPPING": "query: {text}"}
    assert load_settings({"wrapping": None}, environ=environ).wrapping is None
    with pytest.raises(ConfigError, match="port = None is not valid"):
        load_settings({"port": None}, environ={})
    config.write_text("drain_timeout_s = true\n")  # a TOML bool is no duration
    with pytest.raises(ConfigError, match="drain_timeout_s = True is not valid"):
        load_settings(environ={"EMBEDX_CONFIG": str(config)})


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("EMBEDX_HOST", "localhost", "host"),  # granian binds addresses only
        ("EMBEDX_HOST", "not a host", "host"),
        ("EMBEDX_API_KEY", "change-me", "api_key"),
        ("EMBEDX_API_KEY", "None", "api_key"),  # read as no key, it turned the check off
        ("EMBEDX_PORT", "eighty", "port"),
        ("EMBEDX_PORT", "70000", "port"),
        ("EMBEDX_MAX_BATCH_TOKENS", "0", "max_batch_tokens"),
        ("EMBEDX_NORMALIZE", "maybe", "normalize"),
        ("EMBEDX_DEVICES", "0,gpu1", "devices"),
        ("EMBEDX_DEVICES", "0,0", "devices"),
        ("EMBEDX_WRAPPING", "query: {text} {text}", "wrapping"),
        ("EMBEDX_WRAPPING", "no placeholder", "wrapping"),
        ("EMBEDX_DEVICE_BATCH_TOKENS", "cpu:100", "device_batch_tokens"),
        ("EMBEDX_LOG_LEVEL", "loud", "log_level"),
        ("EMBEDX_DEFAULT_KEEP_ALIVE_S", "nan", "default_keep_alive_s"),
        ("EMBEDX_BATCH_TIMEOUT_S", "inf", "batch_timeout_s"),
        ("EMBEDX_DRAIN_TIMEOUT_S", "-1", "drain_timeout_s"),
        ("EMBEDX_BODY_TIMEOUT_S", "0", "body_timeout_s"),  # every body would be late
    ],
)
def test_a_bad_value_names_its_key_and_value(variable: str, value: str, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={variable: value})
    assert named in caught.value.message
    assert repr(value) in caught.value.message


def test_a_config_path_that_points_nowhere_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigError, match="not a file"):
        load_settings(environ={"EMBEDX_CONFIG": str(missing)})


def test_an_unknown_key_in_the_file_or_environment_is_an_error(tmp_path: Path) -> None:
    config = tmp_path / "embedx.toml"
    config.write_text("prot = 1\n")
    with pytest.raises(ConfigError, match=r"'prot'\. Did you mean port\?"):
        load_settings(environ={"EMBEDX_CONFIG": str(config)})
    with pytest.raises(ConfigError, match=r"EMBEDX_PROT .*Did you mean EMBEDX_PORT\?"):
        load_settings(environ={"EMBEDX_PROT": "1"})
    with pytest.raises(ConfigError, match=r"'device'\. Did you mean devices\?"):
        load_settings({"device": "cpu"})  # as Embedder(..., device="cpu") passes it
    for written in ("MAX_BATCH_TOKENS", "EMBEDX_MAX_BATCH_TOKENS"):  # the environment's form
        config.write_text(f"{written} = 1\n")
        with pytest.raises(ConfigError, match=r"Did you mean max_batch_tokens\?"):
            load_settings(environ={"EMBEDX_CONFIG": str(config)})


def test_a_value_that_is_no_number_says_what_was_expected() -> None:
    with pytest.raises(ConfigError, match=r"= 'abc' is not valid: expected an integer$"):
        load_settings(environ={"EMBEDX_MAX_BATCH_TOKENS": "abc"})
    with pytest.raises(ConfigError, match=r"expected a number of seconds$"):
        load_settings(environ={"EMBEDX_DRAIN_TIMEOUT_S": "soon"})


@pytest.mark.parametrize("variable", ["EMBEDX_MODEL_ID", "EMBEDX_POOLING"])
def test_a_server_wide_model_or_pooling_is_refused(variable: str) -> None:
    with pytest.raises(ConfigError, match="request"):
        load_settings(environ={variable: "anything"})


def test_the_request_count_limit_replaced_by_the_inputs_one_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="EMBEDX_MAX_INPUTS_IN_FLIGHT"):
        load_settings(environ={"EMBEDX_MAX_CONCURRENT_REQUESTS": "64"})
    config = tmp_path / "embedx.toml"
    config.write_text("max_concurrent_requests = 64\n")
    with pytest.raises(ConfigError, match=r"max_concurrent_requests is not a setting.*INPUTS"):
        load_settings(environ={"EMBEDX_CONFIG": str(config)})


def test_devices_take_indices_and_cpu() -> None:
    settings = load_settings(environ={"EMBEDX_DEVICES": "1, 0,CPU"})
    assert settings.devices == ("1", "0", "cpu")
    assert load_settings(environ={"EMBEDX_DEVICES": "auto"}).devices is None


def test_per_device_maps_parse() -> None:
    settings = load_settings(
        environ={
            "EMBEDX_MAX_BATCH_TOKENS": "65536",
            "EMBEDX_DEVICE_BATCH_TOKENS": "0=65536,cpu=2048",
            "EMBEDX_DEVICE_WEIGHTS": "cpu=0.1",
        }
    )
    assert settings.device_batch_tokens == {"0": 65536, "cpu": 2048}
    assert settings.device_weights == {"cpu": 0.1}


@pytest.mark.parametrize(
    ("variable", "raw", "says"),
    [
        ("EMBEDX_DEVICE_WEIGHTS", "cpu=nan", "positive number"),
        ("EMBEDX_DEVICE_WEIGHTS", "0=inf", "positive number"),
        ("EMBEDX_DEVICE_WEIGHTS", "cpu=1,cpu=2", "names a device twice"),
        ("EMBEDX_DEVICE_BATCH_TOKENS", "0=1,0=2", "names a device twice"),
        ("EMBEDX_DEVICE_BATCH_TOKENS", "0=300000", "above EMBEDX_MAX_BATCH_TOKENS (262144)"),
    ],
)
def test_a_per_device_map_that_cannot_mean_one_thing_is_refused(
    variable: str, raw: str, says: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_settings(environ={variable: raw})


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"max_batch_tokens": -5}, "must be at least 1"),
        ({"devices": ("cuda",)}, "neither a GPU index nor 'cpu'"),
        ({"batch_timeout_s": -1.0}, "0 or more"),
    ],
)
def test_settings_made_by_hand_are_checked_as_loaded_ones_are(
    given: dict[str, object], says: str
) -> None:
    """`Embedder(settings=Settings(...))` skips load_settings: the same checks hold."""
    with pytest.raises(ConfigError, match=re.escape(says)):
        Settings(**given)  # type: ignore[arg-type]
    read = Settings(normalize="no", log_level="INFO", models_file="~/m.toml")  # type: ignore[arg-type]
    assert read.normalize is False  # as EMBEDX_NORMALIZE=no is, not truthy
    assert read.log_level == "info"
    assert read.models_file == Path("~/m.toml").expanduser()


def test_an_api_key_is_stripped_as_a_clients_header_is() -> None:
    assert load_settings(environ={"EMBEDX_API_KEY": " s3cret\n"}).api_key == "s3cret"
    assert load_settings(environ={"EMBEDX_API_KEY": " "}).api_key is None  # empty: no key


def test_redacted_settings_show_the_api_key_only_as_set() -> None:
    shown = load_settings(environ={"EMBEDX_API_KEY": "s3cret"}).redacted()
    assert shown["api_key"] == "set"
    assert "s3cret" not in str(shown)


def test_the_configuration_tables_are_rendered_from_settings() -> None:
    table = settings_table()
    assert table.count("\n") == len(Settings.__dataclass_fields__) + 1
    assert table in CONFIGURATION.read_text(), "docs/configuration.md's table is stale"
    # the README's few rows are rows of it, word for word
    rows = [line for line in README.read_text().splitlines() if line.startswith("| `EMBEDX_")]
    assert len(rows) >= 5
    assert all(row in table.splitlines() for row in rows)
