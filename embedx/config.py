"""Settings: defaults < TOML at $EMBEDX_CONFIG < EMBEDX_* environment < CLI flags, checked once."""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embedx import config_values as values
from embedx.errors import ConfigError

ENV_PREFIX = "EMBEDX_"
# Not settings: a server-wide model or pooling would hide what requests name; and a
# setting replaced, said so rather than ignored.
NOT_SETTINGS = {
    "EMBEDX_MODEL_ID": "requests name their model: send `model` in each request, "
    "or add the model to the catalog (EMBEDX_MODELS_FILE)",
    "EMBEDX_POOLING": "pooling is stated per model: send `pooling` with the first request "
    "for a model, or set it in the catalog (EMBEDX_MODELS_FILE)",
    "EMBEDX_MAX_CONCURRENT_REQUESTS": "admission counts inputs, not requests: set "
    "EMBEDX_MAX_INPUTS_IN_FLIGHT (default 8192; a request of n texts or pairs holds n)",
}


def _did_you_mean(key: str, names: Iterable[str], prefix: str = "") -> str:
    """A near setting name, found whatever the case (a TOML file's MAX_BATCH_TOKENS) and
    with or without the environment's EMBEDX_ prefix."""
    wanted = key.lower().removeprefix(ENV_PREFIX.lower())
    close = difflib.get_close_matches(wanted, list(names), n=1)
    return f" Did you mean {prefix}{close[0].upper() if prefix else close[0]}?" if close else ""


def _setting(default: Any, parse: Callable[[object], Any], help: str, shown: str = "") -> Any:
    metadata = {"parse": parse, "help": help, "shown": shown}
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True, slots=True)
class Settings:
    """Every operator setting. docs/configuration.md's table is rendered from these fields."""

    host: str = _setting(
        "127.0.0.1", values.host, "IP address to bind. Beyond loopback, set an API key."
    )
    port: int = _setting(8477, values.port, "TCP port.")
    api_key: str | None = _setting(
        None, values.api_key, "Bearer token required on every route but /health.", "unset"
    )
    cors_allow_origins: tuple[str, ...] = _setting(
        (),
        values.names,
        "Browser origins that may call the API (CORS), comma separated, e.g. "
        "`https://app.example.com`, or `*` for any; unset: none.",
        "unset",
    )
    log_level: str = _setting("info", values.log_level, "One of debug, info, warning, error.")
    devices: tuple[str, ...] | None = _setting(
        None,
        values.devices,
        "Devices to serve on: GPU indices and `cpu`, e.g. `0,1,cpu`. "
        "`auto`: every GPU, or the CPU when there is none.",
        "auto",
    )
    # The library ran MiniLM on an H200 at 3.5M tok/s with 262,144 and 2.6M with 16,384.
    max_batch_tokens: int = _setting(
        262144,
        values.integer(1),
        "Cap on a batch's padded tokens (items x longest) on any device. Below it, a GPU's "
        "budget is what its free memory holds at load (two batches in flight, 15% left "
        "free); the CPU's is 4096.",
    )
    # On an H100, 2048 answered one text alone in 1.5 to 1.9 ms where eager launches took
    # 3.9 to 4.0 (bench/results/online.md).
    cuda_graph_tokens: int = _setting(
        2048,
        values.integer(0),
        "Batches up to this many tokens run on a GPU as CUDA graphs, captured for a few shapes "
        "when a model loads (one launch, not several a layer); 0: none, every launch eager.",
    )
    max_batch_items: int | None = _setting(
        None,
        values.optional(values.integer(1)),
        "Cap on the number of texts in one batch (never above 32768).",
        "unset",
    )
    device_weights: dict[str, float] = _setting(
        {},
        values.device_map(values.positive_float),
        "Static speed scores that order devices before any is measured (`embedx info`, the "
        "order models load in), e.g. `0=1,cpu=0.02`. Never a load ratio: each model ranks "
        "its devices by the speed its load measured.",
        "unset",
    )
    device_batch_tokens: dict[str, int] = _setting(
        {},
        values.device_map(values.integer(1)),
        "Per-device token budget that overrides the memory-derived one, e.g. `cpu=2048`; "
        "at most EMBEDX_MAX_BATCH_TOKENS.",
        "unset",
    )
    preload: tuple[str, ...] = _setting(
        (),
        values.names,
        "Catalog models to load at start-up, comma separated, and keep loaded (unless their "
        "entry sets keep_alive_s); the rest load on first use.",
        "unset",
    )
    default_model: str | None = _setting(
        None,
        values.optional(values.string),
        "Catalog model for requests that name none, as TEI's clients send them: /embed's, "
        "and /rerank's and /predict's where it scores (else the first scorer preloaded).",
        "the first of EMBEDX_PRELOAD",
    )
    models_file: Path | None = _setting(
        None,
        values.optional(values.path),
        "TOML catalog of named models (source, pooling, prompts).",
        "unset",
    )
    catalog_only: bool = _setting(
        False, values.boolean, "Serve only catalog models; any other name is a 404."
    )
    allow_local_paths: bool = _setting(
        False,
        values.boolean,
        "Let requests name a local model directory by its path (else only catalog names and "
        "Hugging Face repo ids). Any client can then read any model directory the server can, "
        "and learn which paths exist.",
    )
    show_model_sources: bool = _setting(
        False,
        values.boolean,
        "Show where each model's files lie (its directory) and EMBEDX_MODELS_FILE's path in "
        "/info; off, clients see model names only.",
    )
    revision: str | None = _setting(
        None,
        values.optional(values.string),
        "Default Hugging Face revision for hub models.",
        "unset",
    )
    normalize: bool = _setting(
        True, values.boolean, "L2-normalize embeddings unless a request says not."
    )
    wrapping: str | None = _setting(
        None,
        values.optional(values.wrapping),
        "Template applied to every input, with `{text}` exactly once, e.g. `query: {text}`; "
        "the model's prompt for the input's type replaces it.",
        "unset",
    )
    max_request_items: int = _setting(2048, values.integer(1), "Most inputs in one request.")
    max_request_bytes: int = _setting(
        32_000_000, values.integer(1), "Largest request body, in bytes."
    )
    # A MiniLM request of 256 texts is about 60 kB: 5 s is generous for it, and 5 s a MB
    # (1.6 Mbit/s) lets a slow link send a large body. Waiting no longer than that, a client
    # that trickles its body holds a connection, and its share of the bytes below, for a bound.
    body_timeout_s: float = _setting(
        5.0,
        values.positive_seconds,
        "Seconds a request body may take to arrive, for each MB (10^6 bytes) of it, and at "
        "least that for any body; a slower one gets a 408 and its connection is closed.",
    )
    # 4 bodies of the largest size at once, any number of small ones beside. A body's bytes
    # are held about 2.5 times over while read and parsed: 64 bodies of 30 MB at once took
    # the server from 530 MB to 917 MB, against 690 MB to 5.2 GB before (bench/abuse.py).
    max_body_bytes_in_flight: int = _setting(
        128_000_000,
        values.integer(1),
        "Bytes of request bodies read, parsed and embedded at once, reserved before a body is "
        "read (its declared length, or EMBEDX_MAX_REQUEST_BYTES when it is chunked) until its "
        "response; the rest wait in turn. A body larger than this runs alone.",
    )
    # An H200 serving MiniLM ran 2.09M tok/s with 8 requests of 256 texts in flight and
    # 2.88M with 32 (8,192 texts); more ran no faster, only with longer waits (bench/load.py,
    # bench/results/load.md). Counted in inputs, not requests: one-text requests from 256
    # clients all run at once.
    max_inputs_in_flight: int = _setting(
        8192,
        values.integer(1),
        "Inputs (texts, pairs) of the requests being embedded or scored at once; a request "
        "of n inputs holds n until answered, and the rest wait in arrival order. A request "
        "larger than this runs alone.",
    )
    request_queue_timeout_s: float = _setting(
        30.0,
        values.seconds,
        "How long a request may wait for its inputs' turn, or for its body's bytes, before a 503.",
    )
    default_keep_alive_s: float = _setting(
        600.0,
        values.seconds,
        "Idle seconds before a model unloads; 0 unloads when its last user leaves.",
    )
    max_loaded_models: int = _setting(
        4,
        values.integer(1),
        "Most copies of model weights resident at once (names over one source, revision, "
        "dtype, length and pooling share one); the least recently used idle one is evicted "
        "(also when a model fits on no device beside those loaded).",
    )
    max_concurrent_loads: int = _setting(2, values.integer(1), "Models loading at the same time.")
    smoke_test_on_load: bool = _setting(
        True, values.boolean, "Embed one text after loading, before use."
    )
    batch_timeout_s: float = _setting(
        60.0,
        values.seconds,
        "A batch running longer than this (and 20x its expected time) marks its device hung; "
        "a load's own batches get at least 60 s.",
    )
    drain_timeout_s: float = _setting(
        30.0,
        values.seconds,
        "On shutdown, how long in-flight requests may take to finish; "
        "those still running then get a 503.",
    )

    def __post_init__(self) -> None:
        """Checked and read as the environment's values are, however it was made: by
        load_settings, or by hand for `Embedder(settings=)`, where `normalize="no"` would
        otherwise be truthy and `log_level="INFO"` refused."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.default is None:
                continue
            object.__setattr__(self, f.name, _parse(f.name, value, "Settings"))  # frozen
        over = {k: v for k, v in self.device_batch_tokens.items() if v > self.max_batch_tokens}
        if over:
            raise ConfigError(
                f"EMBEDX_DEVICE_BATCH_TOKENS gives {over}, above EMBEDX_MAX_BATCH_TOKENS "
                f"({self.max_batch_tokens}), the cap on any device: raise the cap too"
            )

    def redacted(self) -> dict[str, Any]:
        """The resolved settings, safe to show: the API key only as set or not."""
        shown: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "api_key":
                value = "set" if value else "unset"
            elif f.name == "devices" and value is None:
                value = "auto"
            elif isinstance(value, Path):
                value = str(value)
            elif isinstance(value, tuple):
                value = list(value)
            shown[f.name] = value
        return shown


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def _parse(name: str, raw: object, origin: str) -> Any:
    f = Settings.__dataclass_fields__[name]
    try:
        return f.metadata["parse"](raw)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{origin}: {name} = {raw!r} is not valid: {exc}") from None


def load_settings(
    overrides: Mapping[str, object] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Resolve every setting; any bad key or value raises ConfigError naming it."""
    environ = os.environ if environ is None else environ
    names = set(Settings.__dataclass_fields__)
    values: dict[str, Any] = {}

    for var, why in NOT_SETTINGS.items():
        if var in environ:
            raise ConfigError(f"{var} is not a setting: {why}.")

    config_path = environ.get("EMBEDX_CONFIG")
    if config_path:
        path = Path(config_path).expanduser()
        if not path.is_file():
            raise ConfigError(f"EMBEDX_CONFIG points to {path}, which is not a file.")
        try:
            table = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"EMBEDX_CONFIG {path} cannot be read: {exc}") from None
        for key, raw in table.items():
            if refused := NOT_SETTINGS.get(ENV_PREFIX + key.upper()):
                raise ConfigError(f"{path}: {key} is not a setting: {refused}.")
            if key not in names:
                raise ConfigError(f"{path}: unknown setting {key!r}.{_did_you_mean(key, names)}")
            values[key] = _parse(key, raw, str(path))

    for var, raw in environ.items():
        if not var.startswith(ENV_PREFIX) or var == "EMBEDX_CONFIG":
            continue
        key = var[len(ENV_PREFIX) :].lower()
        if key not in names:
            raise ConfigError(
                f"unknown setting {var} in the environment.{_did_you_mean(key, names, ENV_PREFIX)}"
            )
        values[key] = _parse(key, raw, "environment " + var)

    for key, raw in (overrides or {}).items():  # None too: `wrapping=None` means none
        if key not in names:
            raise ConfigError(f"unknown setting {key!r}.{_did_you_mean(key, names)}")
        values[key] = _parse(key, raw, "--" + key.replace("_", "-"))

    return Settings(**values)


def settings_table() -> str:
    """docs/configuration.md's table (and the README's rows of it), rendered from Settings."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(Settings):
        shown = f.metadata["shown"]
        if not shown:
            default = f.default
            shown = str(default).lower() if isinstance(default, bool) else str(default)
            if isinstance(default, float) and default.is_integer():
                shown = str(int(default))
        lines.append(f"| `{env_name(f.name)}` | `{shown}` | {f.metadata['help']} |")
    return "\n".join(lines)
