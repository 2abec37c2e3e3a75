"""What a model name means: a catalog entry, a Hugging Face repo id, or (where the operator
allows) a local directory; and a request's load fields settled against what is stated."""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from embedx.config import Settings
from embedx.errors import (
    ConfigError,
    InvalidOption,
    ModelNotFound,
    PoolingConflict,
    PoolingRequired,
)
from embedx.models.catalog import ModelSpec, check_dtype
from embedx.models.pooling import Pooling
from embedx.models.source import (
    HUB_PREFIX,
    PACKAGE_PREFIX,
    check_exists,
    is_repo_id,
    local_directory,
)
from embedx.registry.residency import weights_key


@dataclass(frozen=True, slots=True)
class LoadRequest:
    """What a request may say about a model's first load; ignored once it is resident,
    except a pooling that differs, which is a conflict. `task`: what the request wants of it
    (embed texts, or score pairs: a scorer needs no pooling)."""

    pooling: str | None = None
    dtype: str | None = None
    max_seq_len: int | None = None
    keep_alive_s: float | None = None
    task: str | None = "embed"  # None: not said (a preload)


class Names:
    """Model names as one server (or library) understands them."""

    def __init__(
        self, settings: Settings, catalog: Mapping[str, ModelSpec], *, local_paths: bool
    ) -> None:
        self.settings = settings
        self.catalog = catalog
        # Whether a name the catalog lacks may be a local directory: so for the library and
        # the CLI, whose caller is the operator; the server's requests only if its operator
        # says so (EMBEDX_ALLOW_LOCAL_PATHS).
        self.local_paths = local_paths

    def spec_for(self, name: str, request: LoadRequest) -> ModelSpec:
        """The catalog's entry for `name`, or (unless catalog-only) a spec built from the
        request, with the request's load fields filling what the catalog leaves open. Without
        local paths, a name the catalog lacks is a Hugging Face repo id or nothing."""
        if request.dtype is not None:
            check_dtype(request.dtype)
        spec = self.catalog.get(name)
        if spec is None:
            if self.settings.catalog_only:
                raise ModelNotFound(
                    f"model {name!r} is not in this server's catalog (EMBEDX_CATALOG_ONLY is on)",
                    param="model",
                )
            if name.startswith(PACKAGE_PREFIX):  # it imports a module: the operator's to name
                raise ModelNotFound(
                    f"model {name!r} is not in this server's catalog: `package:` sources are "
                    "named in the models file, not by requests",
                    param="model",
                )
            source = name
            if not self.local_paths:
                # Decided from the name alone, never the disk: a path that exists and one that
                # does not get the same answer, so none can be probed.
                if not is_repo_id(name):
                    raise ModelNotFound(
                        f"model {name!r} is neither in this server's catalog nor a Hugging Face "
                        "repo id; requests may not name local directories here "
                        f"(EMBEDX_ALLOW_LOCAL_PATHS is off){self.did_you_mean(name)}",
                        param="model",
                    )
                source = HUB_PREFIX + name  # `org/model` is never a directory of the same name
            spec = ModelSpec(name=name, source=source, revision=self.settings.revision)
        pooling = asked_pooling(name, spec.pooling, request.pooling)
        asked_length(name, spec.max_seq_len, request.max_seq_len)
        return spec.with_overrides(
            pooling=spec.pooling or pooling,
            dtype=request.dtype if spec.dtype == "auto" else None,
            max_seq_len=spec.max_seq_len or request.max_seq_len,
            keep_alive_s=spec.keep_alive_s
            if spec.keep_alive_s is not None
            else request.keep_alive_s,
        )

    def look_up(self, name: str, spec: ModelSpec) -> bool:
        """Whether the model `spec` (for the name `name`) exists, False where the hub could
        not be asked (blocking: it may). One found nowhere is ModelNotFound, ending with the
        catalog name it may have meant."""
        try:
            return check_exists(spec.source, spec.revision)
        except ModelNotFound as exc:
            raise ModelNotFound(exc.message + self.did_you_mean(name), param=exc.param) from None

    def did_you_mean(self, name: str) -> str:
        """A catalog name the request may have meant (the same model without its owner, or
        a near spelling), as the end of a message."""
        tail = name.rsplit("/", 1)[-1].lower()
        same = [known for known in self.catalog if known.rsplit("/", 1)[-1].lower() == tail]
        close = same or difflib.get_close_matches(name, list(self.catalog), n=1, cutoff=0.8)
        return f"; did you mean {close[0]!r}?" if close else ""

    def pooling_required(self, name: str, found: bool) -> PoolingRequired:
        """Why a name not loaded whose pooling nobody stated cannot load (`found`: whether the
        hub could say it exists)."""
        unchecked = (
            ""
            if found
            else " (the Hugging Face hub could not be reached to check that it exists; with "
            "HF_HUB_OFFLINE=1 a name found nowhere is a 404)"
        )
        return PoolingRequired(
            f"model {name!r} is not loaded and its pooling is unknown{unchecked}: send pooling "
            "(cls, mean or last_token) with the first request, or add it to the catalog. embedx "
            f"never guesses pooling{self.did_you_mean(name)}",
            param="pooling",
        )

    def served_as(self, name: str) -> tuple[str, Path | None]:
        """The name a request's model is served under, and the directory it names if it is a
        local one. That directory is one model however a request spells it (`/m`, `/m/`,
        `//./m`), not a copy of the weights per spelling, and its name says where it is to
        no client (see `local_name`)."""
        if name in self.catalog or self.settings.catalog_only or not self.local_paths:
            return name, None
        directory = local_directory(name)
        if directory is None:
            return name, None
        resolved = directory.resolve()
        return local_name(resolved), resolved


def local_name(directory: Path) -> str:
    """The name a local directory that a request named is served under: its own name and a
    digest of its path, one name per directory, that tells no client where it is."""
    digest = hashlib.sha256(str(directory).encode(errors="surrogateescape")).hexdigest()
    return f"local:{directory.name}@{digest[:12]}"


def check_preload(settings: Settings, catalog: Mapping[str, ModelSpec]) -> None:
    """EMBEDX_PRELOAD names catalog entries: no request comes with a preload to say what it
    is. (An embedding model among them without a pooling fails to load, and so the start.)"""
    missing = [name for name in settings.preload if name not in catalog]
    if missing:
        raise ConfigError(f"EMBEDX_PRELOAD names models not in the catalog: {missing}")
    # They stay resident: the copies of weights they need (names over one source share one)
    # must fit the cap.
    copies = {weights_key(catalog[name]) for name in settings.preload}
    if len(copies) > settings.max_loaded_models:
        raise ConfigError(
            f"EMBEDX_PRELOAD names models over {len(copies)} copies of weights, more than "
            f"EMBEDX_MAX_LOADED_MODELS ({settings.max_loaded_models}) can hold: they are never "
            "unloaded"
        )


def check_default_model(settings: Settings, catalog: Mapping[str, ModelSpec]) -> None:
    """EMBEDX_DEFAULT_MODEL serves TEI's clients, which name no model and can state no
    pooling: it must be a catalog entry (with a pooling, where it embeds)."""
    name = settings.default_model
    if name is not None and name not in catalog:
        raise ConfigError(
            f"EMBEDX_DEFAULT_MODEL {name!r} must be a catalog model (in EMBEDX_MODELS_FILE): "
            "the requests it serves name no model and state no pooling"
        )


def asked_length(name: str, reads: int | None, asked: int | None) -> None:
    """A request's max_seq_len, where its catalog entry or its load has fixed the model's,
    must be that one: silently reading another length would be wrong either way."""
    if asked is not None and reads is not None and asked != reads:
        raise InvalidOption(
            f"model {name!r} reads {reads} tokens a text (fixed by its catalog entry or its "
            f"first load); this request asks for max_seq_len {asked}: drop the field or use "
            "another name",
            param="max_seq_len",
        )


def asked_pooling(name: str, stated: Pooling | None, asked: str | None) -> Pooling | None:
    """The pooling a request asks for, if any; a conflict if the model's is another one."""
    pooling = Pooling.parse(asked) if asked is not None else None
    if pooling is not None and stated is not None and pooling is not stated:
        raise PoolingConflict(
            f"model {name!r} uses {stated.value} pooling; this request asks for "
            f"{pooling.value}. Pooling is fixed per model: drop the field or use another name",
            param="pooling",
        )
    return pooling
