"""The reading budgets (docs/DESIGN.md, "Sizes"): names, defaults and accepted ranges."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import Invalid


@dataclass(frozen=True)
class Size:
    default: int
    low: int
    high: int
    meaning: str
    # OptMem's `memo` knows this size: an export may set it in memo's config file. memo refuses a file that
    # sets one it does not know ("is not a size"), and its release of 2026 knows none but these.
    optmem: bool = True


SIZES: dict[str, Size] = {
    "WAKE_LINES": Size(96, 1, 1000, "most lines the wake shows"),
    "WAKE_CHARS": Size(1_000_000, 1, 100_000_000, "most bytes one wake read costs", optmem=False),
    "ENTRY_CHARS": Size(280, 1, 280, "longest note or summary, in bytes"),
    "PART_CHARS": Size(20_000, 1, 10_000_000, "largest output part, in bytes"),
    "PART_LINES": Size(500, 1, 100_000, "largest output part, in lines"),
}

DEFAULTS = {name: s.default for name, s in SIZES.items()}


def effective(overrides: dict[str, int]) -> dict[str, int]:
    return {name: overrides.get(name, s.default) for name, s in SIZES.items()}


def validate_changes(changes: object) -> dict[str, int | None]:
    """A ``{NAME: int | null}`` object, every name known and every value in
    range; refuses the whole change on the first bad entry."""
    if not isinstance(changes, dict) or not changes:
        raise Invalid(
            'Send an object of sizes to change, like {"WAKE_LINES": 64}; null restores a default.',
            code="config.empty",
        )
    out: dict[str, int | None] = {}
    for name, value in changes.items():
        size = SIZES.get(name)
        if size is None:
            raise Invalid(
                f"'{str(name)[:40]}' is not a size; name one of {', '.join(SIZES)}.", code="config.unknown_name"
            )
        if value is None:
            out[name] = None
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not size.low <= value <= size.high:
            raise Invalid(
                f"{name} must be a whole number from {size.low} to {size.high}, or null for the default "
                f"({size.default}).",
                code="config.out_of_range",
            )
        out[name] = value
    return out
