"""An independent numpy reference for the composition matrix.

Nothing here imports xpatch: every expected value comes from ``numpy.pad`` of the
whole image, a plain Python loop over the patches' index windows, and the windows'
formulas written out again, so that a bug shared by two xpatch paths cannot hide.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def window_1d(name: str, n: int) -> np.ndarray:
    """The 1-D window xpatch documents: boxcar, or Hann at half-sample positions."""
    if name == "boxcar":
        return np.ones(n)
    if name == "hann":
        return np.sin(np.pi * (np.arange(n) + 0.5) / n) ** 2
    raise ValueError(f"no reference for window {name!r}")


def window_2d(name: str, size: Sequence[int]) -> np.ndarray:
    """The separable 2-D window: the outer product of the 1-D ones."""
    return np.outer(window_1d(name, size[0]), window_1d(name, size[1]))


def regular_starts(n: int, size: int, stride: int, mode: str) -> list[int]:
    """Starts of the regular grid along one dim, per boundary mode."""
    if mode == "periodic":
        return list(range(0, n, stride))
    if mode == "drop":
        return list(range(0, n - size + 1, stride))
    if mode == "pad":
        starts = [0]
        while starts[-1] + size < n:
            starts.append(starts[-1] + stride)
        return starts
    if mode == "shift":
        starts = list(range(0, n - size + 1, stride))
        if starts[-1] + size < n:
            starts.append(n - size)
        return starts
    raise ValueError(mode)


def padded(image: np.ndarray, width: int, pad_mode: str, periodic_x: bool) -> np.ndarray:
    """The whole image padded by ``width`` on both sides of its last two dims."""
    lead = [(0, 0)] * (image.ndim - 2)
    out = np.pad(image, [*lead, (width, width), (0, 0)], mode=pad_mode)
    return np.pad(out, [*lead, (0, 0), (width, width)], mode="wrap" if periodic_x else pad_mode)


class Reference:
    """Expected values for one layout of a ``(..., y, x)`` image.

    Parameters
    ----------
    image
        The whole image, numpy, last two dims ``(y, x)``.
    size, halo
        Patch size ``(y, x)`` and halo cells on each side.
    window
        ``"boxcar"`` or ``"hann"``.
    boundary
        The boundary mode of ``y`` and ``x``, or ``"periodic"`` (along ``x`` only;
        ``y`` then shifts).
    pad_mode
        numpy.pad's mode for the cells past the edges (a periodic ``x`` wraps).
    """

    def __init__(self, image, size, halo, window, boundary, pad_mode):
        self.image = np.asarray(image, dtype=float)
        self.size, self.halo, self.window = tuple(size), halo, window
        self.boundary, self.pad_mode = boundary, pad_mode
        self.periodic = boundary == "periodic"
        self.width = max(size) + halo + 4
        self.big = padded(self.image, self.width, pad_mode, self.periodic)

    @property
    def shape(self) -> tuple[int, int]:
        return self.image.shape[-2:]

    def grid_anchors(self, stride: int) -> np.ndarray:
        """The regular grid's anchors, row-major."""
        ny, nx = self.shape
        ymode = "shift" if self.periodic else self.boundary
        ys = regular_starts(ny, self.size[0], stride, ymode)
        xs = regular_starts(nx, self.size[1], stride, self.boundary)
        return np.array([(a, b) for a in ys for b in xs], dtype=np.int64)

    def patch(self, anchor, image: np.ndarray | None = None) -> np.ndarray:
        """What ``p[i]`` holds at ``anchor``: the window grown by the halo."""
        big = self.big if image is None else padded(image, self.width, self.pad_mode, self.periodic)
        (a, b), h, w = anchor, self.halo, self.width
        return big[..., w + a - h : w + a + self.size[0] + h, w + b - h : w + b + self.size[1] + h]

    def inner(self, anchor, image: np.ndarray | None = None) -> np.ndarray:
        """The patch's own window, without the halo."""
        h = self.halo
        grown = self.patch(anchor, image)
        return grown[..., h : h + self.size[0], h : h + self.size[1]]

    def cells(self, anchor, scale: int = 1):
        """Index arrays (rows, cols) of a patch's cells on the grid, and their mask inside it."""
        ny, nx = self.shape[0] * scale, self.shape[1] * scale
        rows = anchor[0] * scale + np.arange(self.size[0] * scale)
        cols = anchor[1] * scale + np.arange(self.size[1] * scale)
        if self.periodic:
            cols = cols % nx
        inside = (rows < ny)[:, None] & (cols < nx)[None, :]
        return rows, cols, inside

    def coverage(self, anchors, scale: int = 1) -> np.ndarray:
        """True on the cells some patch covers."""
        ny, nx = self.shape
        covered = np.zeros((ny * scale, nx * scale), bool)
        for a in anchors:
            rows, cols, inside = self.cells(a, scale)
            for r, c in zip(*np.nonzero(inside)):
                covered[rows[r], cols[c]] = True
        return covered

    def blend(
        self,
        anchors,
        values: Callable[[int, np.ndarray], np.ndarray],
        reduce: str = "mean",
        weights: Sequence[float] | None = None,
        scale: int = 1,
        lead: tuple[int, ...] = (),
        cell_weights: Callable[[int, np.ndarray], np.ndarray] | None = None,
    ) -> np.ndarray:
        """Blend per-patch values by a loop over the anchors.

        ``values(i, anchor)`` returns patch ``i``'s inner-window values, shape
        ``lead + size * scale``. ``reduce`` is mean, sum, max, min or vote (``lead``
        empty); cells no patch covers are NaN. ``weights`` are per patch,
        ``cell_weights(i, anchor)`` per cell of the inner window.
        """
        ny, nx = self.shape[0] * scale, self.shape[1] * scale
        win = window_2d(self.window, (self.size[0] * scale, self.size[1] * scale))
        num = np.zeros((*lead, ny, nx))
        den = np.zeros((ny, nx))
        ext = np.full((*lead, ny, nx), np.nan)
        votes: dict[int, np.ndarray] = {}
        pick = np.fmax if reduce == "max" else np.fmin
        for i, a in enumerate(anchors):
            rows, cols, inside = self.cells(a, scale)
            v = np.asarray(values(i, a), dtype=float)
            wi = win * (1.0 if weights is None else float(weights[i]))
            if cell_weights is not None:
                wi = wi * cell_weights(i, a)
            for r, row in enumerate(rows):
                for c, col in enumerate(cols):
                    if not inside[r, c]:
                        continue
                    x = v[..., r, c]
                    if reduce in ("mean", "sum"):
                        num[..., row, col] += wi[r, c] * x
                        den[row, col] += wi[r, c]
                    elif reduce in ("max", "min"):
                        ext[..., row, col] = pick(ext[..., row, col], x)
                    elif reduce == "vote":
                        votes.setdefault(int(x), np.zeros((ny, nx)))[row, col] += wi[r, c]
                        den[row, col] += 1
        if reduce in ("max", "min"):
            return ext
        if reduce == "vote":
            labels = sorted(votes)
            stack = np.stack([votes[k] for k in labels])
            best = stack.max(axis=0)
            # A tie (to one part in 1e9) goes to the smallest label.
            tied = stack >= best - 1e-9 * np.abs(best)
            out = np.asarray(labels, float)[np.argmax(tied, axis=0)]
            return np.where(den > 0, out, np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            if reduce == "sum":
                return np.where(den > 0, num, np.nan)
            return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)
