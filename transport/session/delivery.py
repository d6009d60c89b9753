"""How far a session's frames got: the newest chunk whose every frame left the pacer (issue #33).

The service keeps the checkpoint of each chunk in flight until the transport says the chunk was sent
(`SessionPort.delivered`, docs/continuity.md): a successor then goes on from what the client was sent, not from what
was generated. `DeliveryWatermark` is the binding's pure bookkeeping for it (no awaits, no clock): it learns each
chunk's last frame when the chunk is fed to the pacer, sees each generated frame the pacer releases, and answers the
newest chunk that is done. A chunk counts as done once its last frame was released, or once any frame of a later
chunk was: the pacer's ring is in order, so its earlier frames were sent or dropped (late, or pushed out of the ring)
— either way the client's clock moved past them. A chunk the binding never saw (the session's chunk broadcast
skipped it for a slow feed) is done the same way.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["DeliveryWatermark"]

_REMEMBERED = 16  # chunks whose last frame index is known and not yet done (a chunk or two are in flight)


class DeliveryWatermark:
    """The newest chunk whose frames all left the pacer. Each method returns the new watermark when it advanced,
    else None; it never goes back.

    Example::

        mark = DeliveryWatermark()
        mark.fed(4, last_frame=19)          # chunk 4 is frames 16..19
        mark.released(4, frame=18)          # None: frame 19 is still waiting
        mark.released(4, frame=19)          # 4
    """

    def __init__(self) -> None:
        self._last: OrderedDict[int, int] = OrderedDict()  # chunk -> its last frame's index
        self._released_frame = -1
        self._through = -1

    @property
    def through(self) -> int:
        """The newest chunk done (-1: none yet)."""
        return self._through

    def fed(self, chunk_index: int, last_frame: int) -> int | None:
        """Chunk `chunk_index`, whose last frame is `last_frame`, went to the pacer (whole: its parts and itself)."""
        if chunk_index <= self._through:
            return None
        if self._released_frame >= last_frame:  # its frames went out (as parts) before the whole chunk was fed
            return self._advance(chunk_index)
        self._last[chunk_index] = last_frame
        while len(self._last) > _REMEMBERED:
            self._last.popitem(last=False)
        return None

    def released(self, chunk_index: int, frame: int) -> int | None:
        """The pacer released generated frame `frame` of chunk `chunk_index` (sent, whether or not anyone took it)."""
        self._released_frame = max(self._released_frame, frame)
        last = self._last.get(chunk_index)
        return self._advance(chunk_index if last is not None and frame >= last else chunk_index - 1)

    def _advance(self, chunk_index: int) -> int | None:
        if chunk_index <= self._through:
            return None
        self._through = chunk_index
        for done in [c for c in self._last if c <= chunk_index]:
            del self._last[done]
        return chunk_index
