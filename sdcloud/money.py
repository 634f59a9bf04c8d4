"""Amounts of USD as users write them ('20', '$20', '0.35'): the one check of --max-price and
--budget, for `up`, `resume`, `offers` and `batch submit` alike (commands/common.py wraps it as a
click type; batch jobs built in code pass through it too). At the bottom of the house, beside
durations.py, so that any domain may use it."""

from __future__ import annotations

from .errors import UserError


def usd(value: object, what: str, per_hour: bool = False) -> float:
    """A positive amount of USD from `value`; one line that says what is wrong otherwise.

    A leading `$` is allowed (`--budget '$20'`); a 0 gets a hint, because an unquoted `$20` reaches
    sdcloud as `0` after the shell has expanded `$2`.
    """
    unit = "USD per hour" if per_hour else "USD"
    text = str(value).strip().lstrip("$")
    try:
        amount = float(text)
    except ValueError:
        raise UserError(f"{what} must be a number of {unit}, got {value!r}") from None
    if amount == 0 and isinstance(value, str):
        raise UserError(f"{what} 0 cannot buy anything: if you typed {what} $20, the shell ate the '$20'; "
                        f"write {what} 20 ({unit}) or quote it: {what} '$20'")
    if not amount > 0:
        raise UserError(f"{what} must be a positive number of {unit}, got {value!r}")
    return amount
