"""The one formatting module: hand-worked values at the unit boundaries, and tables that fit."""

from __future__ import annotations

import numpy as np
import pytest

from virtualpar.trace.fmt import count, fit, nbytes, number, rate, seconds, table


@pytest.mark.parametrize("t, text", [
    (0, "0 s"), (1e-13, "0 s"),                       # below a picosecond: residue of differences
    (4e-9, "4 ns"), (5e-10, "0.5 ns"),
    (1e-6, "1 µs"), (1.6e-05, "16 µs"), (3e-6, "3 µs"), (999e-6, "999 µs"),
    (999.96e-6, "1 ms"),                              # rounds to 1000 µs: one unit up
    (0.0125, "12.5 ms"), (0.0123456, "12.35 ms"),     # 4 significant digits
    (0.99999, "1 s"), (2.5, "2.5 s"), (999.4, "999.4 s"),
    (12345.6, "12,346 s"),                            # no exponent, ever
    (-0.002, "-2 ms"),
    (np.float64(3e-6), "3 µs"),
])
def test_seconds(t, text):
    assert seconds(t) == text


@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (512, "512 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536, "1.5 KiB"),
    (1000 * 1024, "1000 KiB"),                        # binary units: 1000 KiB is still under 1 MiB
    (1048575, "1 MiB"),                               # rounds to 1024 KiB: one unit up
    (3 << 20, "3 MiB"), (5 * 2 ** 30, "5 GiB"), (np.int64(2048), "2 KiB"),
])
def test_nbytes(n, text):
    assert nbytes(n) == text


def test_rates_and_counts():
    assert rate(4.85e9) == "4.85 GB/s" and rate(450e6) == "450 MB/s" and rate(999.99e6) == "1 GB/s"
    assert rate(0) == "0 B/s" and rate(12) == "12 B/s" and rate(1e12) == "1 TB/s"
    assert count(196608, "FLOP") == "196.6 kFLOP" and count(196608) == "196.6k"
    assert count(999) == "999" and count(1e9, "FLOP") == "1 GFLOP" and count(1.5) == "1.5"


def test_number_never_shows_a_repr():
    assert number(np.float64(3.0)) == "3" and number(np.int64(12345)) == "12,345"
    assert number(0.000123456) == "0.0001235" and number(True) == "yes" and number(float("nan")) == "nan"
    assert "e" not in number(1.6e-05) and "np." not in number(np.float32(0.5))


def test_table_fits_by_wrapping_text_not_numbers():
    head = ("policy", "ok", "collectives", "bytes")
    rows = [("unsharded", "yes", "all_gather(x) all_gather(y) all_gather(x)", nbytes(36864)),
            ("row", "NO", "-", nbytes(12))]
    wide = table(head, rows).splitlines()
    assert wide[0] == "policy     ok   " + "collectives".ljust(41) + "   bytes"  # numbers right-aligned
    assert wide[2] == "unsharded  yes  all_gather(x) all_gather(y) all_gather(x)  36 KiB"
    assert wide[3] == "row        NO   " + "-".ljust(41) + "    12 B"
    narrow = table(head, rows, width=40).splitlines()
    assert all(len(line) <= 40 for line in narrow)
    assert narrow[2:5] == ["unsharded  yes  all_gather(x)     36 KiB",  # 40 - 18 - 6 - 6 gaps = 16 columns
                           "                all_gather(y)",
                           "                all_gather(x)"]  # the text column wrapped; "36 KiB" stayed whole
    with pytest.raises(ValueError, match="width must be an int >= 20"):
        table(head, rows, width=10)
    with pytest.raises(ValueError, match="a row has 1 cells, the head 4"):
        table(head, [("x",)])


def test_fit():
    assert fit("short", 10) == ["short"]
    assert fit("a b c d e f", 5) == ["a b c", "d e f"]
    assert fit("abcdefghij", 4) == ["abcd", "efgh", "ij"]
