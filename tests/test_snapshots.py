"""The snapshot comparison itself: it lets float noise through and nothing else."""

from snapshots import differences

TABLE = "numpy by hand  output  {diff}  1e-05  pass\ncross  -0.1987×0.6495 = {sum} (32 terms)\n"


def test_float_residues_and_last_digit_rounding_are_noise():
    golden = TABLE.format(diff="1.80e-07", sum="-0.2418")
    assert differences(TABLE.format(diff="1.83e-07", sum="-0.2419"), golden) == []
    assert differences(TABLE.format(diff="9.97e-08", sum="-0.2417"), golden) == []


def test_real_changes_are_not():
    golden = TABLE.format(diff="1.80e-07", sum="-0.2418")
    assert differences(TABLE.format(diff="3.20e-05", sum="-0.2418"), golden)  # not a residue
    assert differences(TABLE.format(diff="1.80e-07", sum="-0.2420"), golden)  # two units
    assert differences(TABLE.format(diff="1.80e-07", sum="-0.241"), golden)  # fewer digits
    assert differences(golden.replace("pass", "FAIL"), golden)
    assert differences(golden.replace("  output", " output "), golden)  # the layout
    assert differences("shape [2, 8, 10, 64]\n", "shape [2, 8, 10, 65]\n")  # integers are exact
    assert differences("6.2 KiB\n", "6.3 KiB\n")  # so are short figures
    assert differences(golden + "one more line\n", golden)
