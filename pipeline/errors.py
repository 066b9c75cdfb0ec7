"""Error types of the domain model: one per kind of user mistake."""

from __future__ import annotations

__all__ = ["AdaptisError", "ProfileError", "ClusterError", "PlanError", "ConfigError"]


class AdaptisError(ValueError):
    """Base of every error a user's input can cause; the message names the field and the fix."""

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None) -> None:
        parts = []
        if source:
            parts.append(str(source))
        if field:
            parts.append(f"field '{field}'")
        prefix = ": ".join(parts)
        super().__init__(f"{prefix}: {message}" if prefix else message)
        self.source = source
        self.field = field


class ProfileError(AdaptisError):
    """A model profile (per-layer costs) is malformed."""


class ClusterError(AdaptisError):
    """A cluster description is malformed."""


class PlanError(AdaptisError):
    """A plan (partition, placement, schedule) is malformed or does not fit its model/cluster."""


class ConfigError(AdaptisError):
    """A model configuration (HF config.json, zoo entry, command-line value) is malformed."""
