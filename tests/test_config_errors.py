"""Every bad config and bad flag: exit 2, one line naming the file, key, line, expected, found."""

import pytest

OK_QKV = """[qkv]
Q = [[1.0, 0.0], [0.0, 1.0]]
K = [[1.0, 0.0], [0.0, 1.0]]
V = [[1.0, 0.0], [0.0, 1.0]]
"""

CASES = {
    "syntax": ('tokens = ["a", "b"\nheads = 1\n',
               "TOML syntax error: Unclosed array (at line 2, column 1)"),
    "no-heads": ('tokens = ["a", "b"]\n' + OK_QKV,
                 "missing key 'heads': expected an integer, e.g. heads = 2"),
    "no-tokens": ('heads = 1\n' + OK_QKV, "missing key 'tokens' (or 'sentence'): expected the "
                  'list of tokens, e.g. tokens = ["The", "cat"]'),
    "typo": ('tokens = ["a", "b"]\nhaeds = 1\n',
             "unknown key 'haeds' (line 2) (did you mean 'heads'?)"),
    "qkv-typo": ('tokens = ["a", "b"]\nheads = 1\n' + OK_QKV + "WO = 1\n",
                 "unknown key 'qkv.WO' (line 7) (did you mean 'qkv.W_O'?)"),
    "ragged": ('tokens = ["a", "b"]\nheads = 1\n' + OK_QKV.replace("[0.0, 1.0]]\nK", "[0.0]]\nK"),
               "qkv.Q row 2 (line 4): expected 2 numbers like row 1, found 1"),
    "rows": ('tokens = ["a", "b", "c"]\nheads = 1\n' + OK_QKV,
             "qkv.Q (line 4): expected 3 rows (one per token), found 2"),
    "non-numeric": ('tokens = ["a", "b"]\nheads = 1\n' + OK_QKV.replace('K = [[1.0, 0.0]', 'K = [[1.0, "x"]'),
                    "qkv.K row 1 column 2 (line 5): expected a finite number, found 'x'"),
    "nan": ('tokens = ["a", "b"]\nheads = 1\n' + OK_QKV.replace("K = [[1.0, 0.0]", "K = [[1.0, nan]"),
            "qkv.K row 1 column 2 (line 5): expected a finite number, found nan"),
    "inf": ('tokens = ["a", "b"]\nheads = 1\n' + OK_QKV.replace("V = [[1.0, 0.0]", "V = [[1.0, -inf]"),
            "qkv.V row 1 column 2 (line 6): expected a finite number, found -inf"),
    "widths": ('tokens = ["a", "b"]\nheads = 1\n'
               + OK_QKV.replace("V = [[1.0, 0.0], [0.0, 1.0]]", "V = [[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]"),
               "qkv.V row 1 (line 6): expected 2 numbers like Q, found 3"),
    "divisible": ('tokens = ["a", "b"]\nheads = 3\n' + OK_QKV,
                  "heads (line 2): d_model=2 is not divisible by heads=3 (valid head counts: 1, 2)"),
    "zero-heads": ('tokens = ["a", "b"]\nheads = 0\n' + OK_QKV,
                   "heads (line 2): expected an integer ≥ 1, found 0"),
    "no-d-model": ('sentence = "a b"\nheads = 1\n', "missing key 'd_model': expected an integer "
                   "(the embedding width), or give Q, K, V in a [qkv] table"),
    "bad-mask": ('sentence = "a b"\nheads = 1\nd_model = 2\nmask = "future"\n',
                 "mask (line 4): expected 'none' or 'causal', found 'future'"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_config_is_one_line(cli, tmp_path, name):
    text, message = CASES[name]
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    for command in ("heads", "explain"):
        result = cli(command, "--config", str(path))
        assert result.exit_code == 2
        assert result.stderr == f"Error: {path}: {message}\n"
        assert result.stdout == ""


def test_missing_file_and_directory(cli, tmp_path):
    result = cli("heads", "--config", str(tmp_path / "nope.toml"))
    assert result.exit_code == 2
    assert result.stderr == f"Error: {tmp_path / 'nope.toml'}: not found\n"
    # a path with a folder never falls back to the bundled config of the same name
    result = cli("heads", "--config", str(tmp_path / "chicken-road.toml"))
    assert result.stderr == f"Error: {tmp_path / 'chicken-road.toml'}: not found\n"
    result = cli("heads", "--config", "nope")
    assert result.stderr == ("Error: nope: no such file, and no bundled config of that name "
                             "(bundled configs: animal-street, cat-sat-on-mat, chicken-road, "
                             "permuted-wo)\n")
    result = cli("heads", "--config", str(tmp_path))
    assert result.exit_code == 2
    assert result.stderr == f"Error: {tmp_path}: is a directory, expected a .toml config file\n"


def test_bundled_config_by_name_or_path(cli):
    by_name = cli("heads", "--config", "permuted-wo").stdout
    assert by_name == cli("heads", "--config", "configs/permuted-wo.toml").stdout
    assert "W_O mixes the heads" in by_name


@pytest.mark.parametrize("args,message", [
    (("explain", "--token", "dog"), "--token 'dog' is not in the sentence (tokens: The, cat, sat, on, mat)"),
    (("explain", "--position", "9"), "--position 9 is out of range (positions 0 to 4: The, cat, sat, on, mat)"),
    (("explain", "--position", "1", "--token", "sat"), "--position 1 is 'cat', not 'sat'"),
    (("heads", "--head", "3"), "--head 3 is out of range (this config has heads 1 to 2)"),
    (("heads", "--head", "0"), "--head 0 is out of range (this config has heads 1 to 2)"),
    (("heads", "--heads", "3"), "--heads: d_model=4 is not divisible by heads=3 (valid head counts: 1, 2, 4)"),
    (("heads", "--heads", "0"), "--heads: heads=0 must be a positive integer (at least 1)"),
    (("heads", "--pad", "5"), "--pad: pad=5 must be at least 0 and less than seq=5 (every query needs one key it may look at)"),
])
def test_bad_flags(cli, args, message):
    result = cli(*args)
    assert result.exit_code == 2
    assert result.stderr == f"Error: {message}\n"


def test_repeated_token_needs_a_position(cli, tmp_path):
    path = tmp_path / "repeat.toml"
    path.write_text('sentence = "a b a"\nd_model = 4\nheads = 2\n')
    result = cli("explain", "--config", str(path), "--token", "a")
    assert result.exit_code == 2
    assert result.stderr == "Error: --token 'a' appears at positions 0, 2 (pick one with --position)\n"
    ok = cli("explain", "--config", str(path), "--token", "a", "--position", "2")
    assert ok.exit_code == 0 and "the query 'a' (position 2)" in ok.stdout
