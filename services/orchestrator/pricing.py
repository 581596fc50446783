"""Money: a price table per model turns one request's usage into US dollars.

The table is a TOML (``.toml``) or JSON file, ``SIGNALBOX_PRICE_FILE``; unset, the defaults
in ``prices.toml`` next to this module (documented there, with where they come from). A
price is USD per million tokens for each of: input, output, cache write (5-minute and
1-hour TTL) and cache read. A broken file is a ``PriceError`` naming it when the worker
builds its runtime (at start), never a silent zero.
"""

from __future__ import annotations

import json
import logging
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger(__name__)

DEFAULT_PRICE_FILE = Path(__file__).with_name("prices.toml")
PER_TOKENS = 1_000_000  # prices are per million tokens


class PriceError(ValueError):
    """The price file cannot be read or has a bad entry."""


class ModelPrice(BaseModel):
    """USD per million tokens of one model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_write_5m: float = Field(ge=0)
    cache_write_1h: float = Field(ge=0)
    cache_read: float = Field(ge=0)


@dataclass(frozen=True)
class Tokens:
    """The usage a request is billed for."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


@dataclass(frozen=True)
class PriceTable:
    """Prices by model name."""

    models: dict[str, ModelPrice]

    @classmethod
    def load(cls, path: Path | None = None) -> PriceTable:
        """The table in ``path`` (TOML or JSON), or the defaults; ``PriceError`` if broken."""
        return _load(path or DEFAULT_PRICE_FILE)

    def price(self, model: str) -> ModelPrice | None:
        """The model's price: its exact name, else the longest name it starts with."""
        found = self.models.get(model)
        if found is not None:
            return found
        prefixes = [name for name in self.models if model.startswith(name)]
        return self.models[max(prefixes, key=len)] if prefixes else None

    def cost_usd(self, model: str, tokens: Tokens, cache_ttl: str = "5m") -> float | None:
        """What the request cost; None when the model has no price (logged)."""
        price = self.price(model)
        if price is None:
            _warn_unpriced(model)
            return None
        write = price.cache_write_1h if cache_ttl == "1h" else price.cache_write_5m
        total = (
            tokens.input_tokens * price.input
            + tokens.output_tokens * price.output
            + tokens.cache_creation_input_tokens * write
            + tokens.cache_read_input_tokens * price.cache_read
        )
        return total / PER_TOKENS


@cache
def _warn_unpriced(model: str) -> None:
    log.warning("model %r has no price in the price table: its cost is recorded as null", model)


@cache
def _load(path: Path) -> PriceTable:
    try:
        raw = path.read_bytes()
        data: Any = tomllib.loads(raw.decode()) if path.suffix == ".toml" else json.loads(raw)
    except (OSError, ValueError) as exc:
        raise PriceError(f"price file {str(path)!r} cannot be read: {exc}") from exc
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict):
        raise PriceError(f"price file {str(path)!r}: expected a 'models' table, got {models!r}")
    try:
        return PriceTable({name: ModelPrice.model_validate(p) for name, p in models.items()})
    except ValidationError as exc:
        raise PriceError(f"price file {str(path)!r}: {exc}") from exc
