"""How a figure is written for a client: our block, or the shape a client already reads.

About twenty client plugins read energy the way Neuralwatt's API returns it: an ``energy``
object ``{energy_joules, energy_kwh, avg_power_watts, duration_seconds, attribution_method,
attribution_ratio}`` at the top of a JSON answer, and in a stream an SSE comment line
``: energy {...}`` just before ``data: [DONE]`` (a comment: every SSE parser skips it, the
``openai`` client included). An :class:`EnergyFormat` says how a figure becomes the block and
where the block rides in a stream; the middleware's ``energy_format`` picks the server's, and
a client may ask for another per request (``Prefer: energy=neuralwatt``, RFC 7240), answered
with ``Preference-Applied``. :class:`Formats` makes that choice once per response, from the
request's headers; the responder is handed the format as a plain value and calls it, so
nothing on the request path branches on a format's name.

Nothing here knows about ASGI or the ledger: an :class:`~giul_asgi.energy.Energy` in, bytes out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ..energy import Energy
from .body import energy_json, json_number, json_string, usage_fields

Header = tuple[bytes, bytes]


class EnergyFormat(Protocol):
    """How a figure is written into a JSON answer and an event stream."""

    #: The name ``energy_format=`` and ``Prefer: energy=`` know it by.
    name: str

    def block(self, energy: Energy, ours: bytes | None = None) -> bytes:
        """The figure as a JSON object (what goes under ``energy_key``). ``ours`` is the same
        figure as our own block (``energy_json``), where the caller made it already."""
        ...

    def stream(self, block: bytes) -> tuple[bytes | None, bytes]:
        """Where ``block`` rides in a stream: spliced into the event that ends the answer
        (None: not there), and the bytes that go just before ``data: [DONE]`` (or the
        stream's end)."""
        ...

    def usage(self, energy: Energy) -> bytes:
        """The fields ``energy_in_usage`` adds to an OpenAI ``usage`` object: named and
        valued as this format's block says them, so the two never disagree."""
        ...


class GiulFormat:
    """Our block (``Energy.as_dict()``), spliced into the event that ends the answer."""

    name = "giul"

    def block(self, energy: Energy, ours: bytes | None = None) -> bytes:
        # The record by id was kept with this block already: written once a request (one
        # energy_json fewer, 2.2 us by timeit; see the commit for the A/B).
        return ours if ours is not None else energy_json(energy)

    def stream(self, block: bytes) -> tuple[bytes | None, bytes]:
        return block, b""

    def usage(self, energy: Energy) -> bytes:
        return usage_fields(energy)


class NeuralwattFormat:
    """Neuralwatt's shape: the figure on the allocated basis (the card's draw over the
    window, idle included, times our share of it), and in a stream an SSE comment before
    ``[DONE]``.

    ``energy_joules`` is ``allocated_joules``; ``avg_power_watts`` the node's mean draw over
    the window (all requests together); ``attribution_ratio`` our share of it
    (``energy_joules / (avg_power_watts x duration_seconds)``, at most 1);
    ``attribution_method`` our ``split`` (``exclusive``, ``time``, ``tokens``), with the
    figure's method after it where the figure is not measured (``time_estimated``,
    ``exclusive_simulated``): the shape has no field for it, and a figure always says how it
    was obtained. Where the node sets a PUE the joules include it, and so does the power
    (the facility's, for the figure's boundary). Unknown stays ``null``.
    """

    name = "neuralwatt"

    def usage(self, energy: Energy) -> bytes:
        """Their block's ``energy_joules`` and ``energy_kwh`` (the allocated basis): a tool
        that reads ``usage.energy_joules`` gets the number the block says under that name."""
        joules = energy.allocated_joules
        return b'"energy_joules":%s,"energy_kwh":%s' % (
            json_number(joules), json_number(None if joules is None else joules / 3.6e6))

    def block(self, energy: Energy, ours: bytes | None = None) -> bytes:
        joules = energy.allocated_joules
        watts, seconds = energy.mean_watts, energy.seconds
        if watts is not None and energy.pue is not None:
            watts *= energy.pue
        ratio = None
        if joules is not None and watts is not None and watts > 0 and seconds > 0:
            ratio = max(0.0, min(1.0, joules / (watts * seconds)))
        method = energy.split or "exclusive"
        if energy.method != "measured":
            method = f"{method}_{energy.method}"
        return (
            b'{"energy_joules":%s,"energy_kwh":%s,"avg_power_watts":%s,"duration_seconds":%s,'
            b'"attribution_method":%s,"attribution_ratio":%s}'
        ) % (
            json_number(joules), json_number(None if joules is None else joules / 3.6e6),
            json_number(watts), json_number(seconds), json_string(method).encode(),
            json_number(ratio),
        )

    def stream(self, block: bytes) -> tuple[bytes | None, bytes]:
        return None, b": energy " + block + b"\n\n"


GIUL = GiulFormat()
NEURALWATT = NeuralwattFormat()
#: Every format by name (``energy_format=`` and ``Prefer: energy=``).
FORMATS: Mapping[str, EnergyFormat] = {f.name: f for f in (GIUL, NEURALWATT)}


@dataclass(frozen=True, slots=True)
class Chosen:
    """The format of one response, and the ``Preference-Applied`` header when the client
    asked for it (``()`` otherwise)."""

    format: EnergyFormat
    applied: tuple[Header, ...] = ()
    #: The response may differ with the request's ``Prefer`` (a client could ask for another
    #: format): it says ``Vary: Prefer``, whether this one asked or not (RFC 9110 12.5.5).
    vary: bool = False


class Formats:
    """The server's format, and those a client may prefer per request (RFC 7240)."""

    __slots__ = ("_applied", "default")

    def __init__(self, default: EnergyFormat = GIUL,
                 known: Mapping[str, EnergyFormat] = FORMATS) -> None:
        self.default = Chosen(default, vary=bool(known))
        #: What answering ``Prefer: energy=<name>`` takes, made once.
        self._applied = {
            name.encode(): Chosen(fmt, ((b"preference-applied", b"energy=" + name.encode()),), vary=True)
            for name, fmt in known.items()
        }

    def for_request(self, headers: Iterable[Header]) -> Chosen:
        """The format a request's ``Prefer`` asks for, if it names one we write; else the
        server's (a preference we do not know is ignored, and not said to be applied)."""
        for key, value in headers:
            if len(key) == 6 and key.lower() == b"prefer":
                wanted = preferred(value, b"energy")
                if wanted is not None:
                    return self._applied.get(wanted.lower(), self.default)
        return self.default


def preferred(value: bytes, name: bytes) -> bytes | None:
    """The value of preference ``name`` in one ``Prefer`` field (RFC 7240: comma-separated
    ``token [= word] *(; parameter)``, names case-insensitive, values maybe quoted); None when
    it is not there. The first one counts."""
    for item in value.split(b","):
        head = item.split(b";", 1)[0]
        key, eq, word = head.partition(b"=")
        if key.strip().lower() == name:
            word = word.strip()
            if len(word) >= 2 and word[:1] == word[-1:] == b'"':
                word = word[1:-1]
            return word if eq and word else None
    return None


__all__ = ["FORMATS", "GIUL", "NEURALWATT", "Chosen", "EnergyFormat", "Formats", "GiulFormat",
           "NeuralwattFormat", "preferred"]
