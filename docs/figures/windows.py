"""Figure: xpatch's windows next to the symmetric Hann window that is 0 at both ends."""

import matplotlib.pyplot as plt
import numpy as np
import scipy.signal
import xarray as xr

import xpatch  # noqa: F401  (registers .patch)

N = 32
line = xr.DataArray(np.zeros(N), dims="x")
windows = {
    '"boxcar"': "boxcar",
    '"hann"': "hann",
    '"triangular"': "triangular",
    '"tukey"': "tukey",
    '("gaussian", 6)': ("gaussian", 6.0),
    '"blackman"': "blackman",
}
k = np.arange(N)

fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2), width_ratios=(2, 1))
for label, spec in windows.items():
    w = line.patch(x=N, window=spec).weights().values
    left.plot(k, w, marker=".", markersize=4, label=label)
left.plot(k, scipy.signal.windows.hann(N), "k--", lw=1, label="scipy hann (symmetric)")
left.set(xlabel="cell k of a 32-cell patch", ylabel="weight w[k]", ylim=(-0.03, 1.05))
left.set_title("xpatch windows (half-sample) vs a symmetric Hann")
left.legend(fontsize=7, ncols=2, loc="lower center")

# The first cells: the half-sample Hann is small but positive, the symmetric one is 0.
first = k[:6]
right.plot(first, line.patch(x=N, window="hann").weights().values[:6], "o-", label="xpatch hann")
right.plot(first, scipy.signal.windows.hann(N)[:6], "ks--", label="scipy hann")
right.axhline(0, color="0.6", lw=0.8)
right.annotate("w[0] = 0:\nno weight", (0, 0), (1.2, 0.12), arrowprops={"arrowstyle": "->"})
right.set(xlabel="cell k", title="first cells", ylim=(-0.02, 0.35))
right.legend(fontsize=7, loc="upper left")
fig.tight_layout()
