"""The models a server holds: names resolved, loaded on first use, kept while used, evicted."""

from embedx.registry.naming import (
    LoadRequest,
    Names,
    check_default_model,
    check_preload,
    local_name,
)
from embedx.registry.registry import ModelRegistry
from embedx.registry.residency import Resident

__all__ = [
    "LoadRequest",
    "ModelRegistry",
    "Names",
    "Resident",
    "check_default_model",
    "check_preload",
    "local_name",
]
