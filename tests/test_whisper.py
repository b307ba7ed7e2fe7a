"""Whisper tiny.en, offline: the WAV reader, the CTranslate2 file, the log-mel, the encoder, greedy
decoding and word timings against faster-whisper and CTranslate2 (a kept fixture made in a scratch
venv: tests/fixtures/make_whisper_reference.py), the cross-attention heads' alignment survey, and
`survey --model whisper` as a user runs it."""

import json
import os
import struct
import wave
from pathlib import Path

import numpy as np
import pytest
from slides import laid_out

from mha_trace.analyses import alignment
from mha_trace.errors import MhaError
from mha_trace.io.audio import RATE, read_wav, resample

pytestmark = pytest.mark.slow  # loads a real model

REFERENCE = np.load(Path(__file__).parent / "fixtures" / "whisper_reference.npz")
CLIPS = json.loads(str(REFERENCE["meta"]))["clips"]
AUDIO = Path(__file__).parent.parent / "examples" / "audio"


@pytest.fixture(scope="module")
def whisper():
    from mha_trace.models.whisper import load_whisper

    return load_whisper()


@pytest.fixture(scope="module")
def heard(whisper):
    return {name: whisper.transcribe(read_wav(AUDIO / f"{name}.wav")) for name in CLIPS}


def _wav(path, samples, rate=RATE, width=2, channels=1):
    kinds = {1: (np.uint8, 127, 128), 2: (np.int16, 32767, 0), 4: (np.int32, 2**31 - 1, 0)}
    dtype, scale, offset = kinds[width]
    frames = np.repeat(np.round(samples * scale + offset)[:, None], channels, axis=1).astype(dtype)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels), w.setsampwidth(width), w.setframerate(rate)
        w.writeframes(frames.tobytes())
    return path


@pytest.mark.parametrize("width,channels", [(1, 1), (2, 2), (4, 1)])
def test_pcm_of_any_width_and_channels_reads_as_the_same_samples(tmp_path, width, channels):
    tone = 0.5 * np.sin(2 * np.pi * 440 * np.arange(RATE // 10) / RATE)
    got = read_wav(_wav(tmp_path / "t.wav", tone, width=width, channels=channels))
    assert got.dtype == np.float32 and len(got) == len(tone)
    np.testing.assert_allclose(got, tone, atol=1.5 / 2 ** (8 * width - 1) + 1e-6)


@pytest.mark.parametrize("rate", [8_000, 22_050, 48_000])
def test_another_rate_is_resampled_keeping_the_pitch_and_the_length(tmp_path, rate):
    tone = 0.5 * np.sin(2 * np.pi * 440 * np.arange(rate) / rate)  # one second
    got = read_wav(_wav(tmp_path / "t.wav", tone, rate=rate))
    assert len(got) == RATE
    spectrum = np.abs(np.fft.rfft(got))
    assert np.argmax(spectrum) * RATE / len(got) == pytest.approx(440, abs=1)
    assert np.abs(got).max() == pytest.approx(0.5, abs=0.01)
    assert resample(tone, RATE) is tone  # already 16 kHz elsewhere: untouched


def test_what_is_not_a_readable_wav_is_one_line(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    long = _wav(tmp_path / "long.wav", np.zeros(31 * RATE))
    empty = _wav(tmp_path / "empty.wav", np.zeros(0))
    with wave.open(str(tmp_path / "24.wav"), "wb") as w:
        w.setnchannels(1), w.setsampwidth(3), w.setframerate(RATE), w.writeframes(b"\0" * 30)
    short = _wav(tmp_path / "short.wav", np.full(160, 0.01))
    (tmp_path / "zero.wav").write_bytes(b"")
    floats = np.full(RATE, np.nan, "<f4").tobytes()  # format 3: float samples, NaN at that
    (tmp_path / "float.wav").write_bytes(b"RIFF" + struct.pack("<I", 36 + len(floats)) + b"WAVEfmt " + struct.pack(
        "<IHHIIHH", 16, 3, 1, RATE, 4 * RATE, 4, 32) + b"data" + struct.pack("<I", len(floats)) + floats)
    forty = bytearray(_wav(tmp_path / "forty.wav", np.zeros(RATE)).read_bytes())  # says 40 minutes in its
    forty[40:44] = struct.pack("<I", 2 * RATE * 60 * 40)  # header: refused before a sample is read
    (tmp_path / "forty.wav").write_bytes(bytes(forty))
    os.mkfifo(tmp_path / "fifo.wav")  # opening it would wait for a writer for ever
    for path, said in [(tmp_path / "none.wav", "no such file"), (tmp_path / "a.txt", "not a PCM WAV"),
                       (long, "at most 30 s"), (empty, "holds no samples"), (short, "0.010 s long: too short"),
                       (tmp_path, "is a folder, not a WAV file"),
                       (tmp_path / "24.wav", "24-bit audio at 16000 Hz, 1 channel: only"),
                       (tmp_path / "zero.wav", r"not a PCM WAV file \(it is empty\)"),
                       (tmp_path / "float.wav", "it holds float samples"),
                       (tmp_path / "forty.wav", "2400.0 s long: Whisper hears at most 30 s"),
                       (tmp_path / "fifo.wav", "not a regular file")]:
        with pytest.raises(MhaError, match=said) as e:
            read_wav(path)
        assert "\n" not in str(e.value) and e.value.quantity == "audio"


def test_a_file_that_is_not_a_ctranslate2_model_is_one_line(tmp_path):
    from mha_trace.models.ct2 import read_ct2

    (tmp_path / "model.bin").write_bytes(b"\x06\0\0\0\x05\0abc")
    with pytest.raises(MhaError, match="not a CTranslate2 model"):
        read_ct2(tmp_path / "model.bin")


def test_the_model_file_reads_whole_with_its_alias(whisper):
    from mha_trace.models import whisper as w
    from mha_trace.models.cache import installed_folder
    from mha_trace.models.ct2 import read_ct2

    found = read_ct2(installed_folder(w.PACKAGE, w.NAME, w.INSTALL, w.FILES) / "model.bin")
    assert len(found) == 149 and found["decoder/projection/weight"] is found["decoder/embeddings/weight"]
    assert (whisper.layers, whisper.encoder_layers, whisper.heads, whisper.d_model) == (4, 4, 6, 384)
    assert whisper.vocab_size == 51864 and len(whisper.alignment_heads) == 8


@pytest.mark.parametrize("name", CLIPS)
def test_the_log_mel_equals_faster_whispers(name):
    from mha_trace.models.whisper import N_FRAMES, encoder_input

    mel = encoder_input(read_wav(AUDIO / f"{name}.wav"))
    speech = json.loads(str(REFERENCE[f"{name}_meta"]))["speech_frames"]
    assert mel.shape == (80, N_FRAMES) and (mel[:, speech:] == 0).all()
    np.testing.assert_allclose(mel[:, :speech:4], REFERENCE[f"{name}_mel"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", CLIPS)
def test_the_encoder_equals_ctranslate2s(whisper, name):
    encoded = whisper.encode_audio(read_wav(AUDIO / f"{name}.wav"))[0].numpy()
    speech = json.loads(str(REFERENCE[f"{name}_meta"]))["speech_frames"]
    assert encoded.shape == (1500, 384)
    np.testing.assert_allclose(encoded[: speech // 2 : 8], REFERENCE[f"{name}_encoder"], atol=5e-3, rtol=0)


@pytest.mark.parametrize("name", CLIPS)
def test_greedy_decoding_writes_faster_whispers_tokens(heard, name):
    h = heard[name]
    assert list(h.ids[h.prompt:]) == REFERENCE[f"{name}_ids"].tolist()
    assert h.text == json.loads(str(REFERENCE[f"{name}_meta"]))["text"]
    T = len(h.ids)
    assert h.cross_weights.shape == (4, 6, T, 1500) and h.self_weights.shape == (4, 6, T, T)
    np.testing.assert_allclose(h.cross_weights.sum(-1), 1, atol=1e-5)
    assert np.triu(h.self_weights, 1).max() == 0  # the decoder's self-attention is causal


def test_word_timings_equal_faster_whispers(whisper, heard):
    """Within 0.02 s (one encoder frame) for every word of every clip, and the alignment path
    itself CTranslate2's on the clips where no tie decides it."""
    close, total, same_path = 0, 0, 0
    for name in CLIPS:
        words = alignment.word_timings(heard[name], whisper.tokenizer, whisper.alignment_heads)
        reference = REFERENCE[f"{name}_words"]
        assert [w.word for w in words] == json.loads(str(REFERENCE[f"{name}_meta"]))["words"]
        got = np.array([[w.start, w.end] for w in words])
        close += int((np.abs(got - reference) <= 0.02 + 1e-9).all(axis=1).sum())
        total += len(words)
        rows, columns = alignment.dtw(-alignment.alignment_matrix(heard[name], whisper.alignment_heads))
        same_path += np.array_equal(np.stack([rows, columns], 1), REFERENCE[f"{name}_alignment"])
    assert close >= 0.95 * total and total >= 30
    assert same_path >= 2


def test_dtw_is_whispers_loop_on_random_costs():
    """The anti-diagonal DTW against openai-whisper's double loop, written out (ties included:
    integer costs make many)."""
    rng = np.random.default_rng(0)

    def loop(x):
        N, M = x.shape
        cost, trace = np.full((N + 1, M + 1), np.inf), -np.ones((N + 1, M + 1))
        cost[0, 0] = 0
        for j in range(1, M + 1):
            for i in range(1, N + 1):
                c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
                c, t = (c0, 0) if c0 < c1 and c0 < c2 else (c1, 1) if c1 < c0 and c1 < c2 else (c2, 2)
                cost[i, j], trace[i, j] = x[i - 1, j - 1] + c, t
        trace[0, :], trace[:, 0] = 2, 1
        i, j, path = N, M, []
        while i > 0 or j > 0:
            path.append((i - 1, j - 1))
            t = trace[i, j]
            i, j = (i - 1, j - 1) if t == 0 else (i - 1, j) if t == 1 else (i, j - 1)
        return np.array(path[::-1]).T

    costs = [rng.integers(0, 3, (n, m)).astype(float) for n, m in [(3, 9), (7, 40), (1, 5), (6, 6)]]
    for x in costs:
        rows, columns = alignment.dtw(x)
        np.testing.assert_array_equal(np.stack([rows, columns]), loop(x))
    batch = rng.normal(size=(5, 4, 12))
    for x, r, c in zip(batch, *alignment.dtw(batch)):
        np.testing.assert_array_equal(np.stack([r, c]), loop(x))


def test_median_filter_is_the_median_of_each_reflected_window():
    x = np.random.default_rng(1).normal(size=(2, 11))
    padded = np.pad(x, ((0, 0), (3, 3)), mode="reflect")
    by_hand = np.array([[np.median(row[i:i + 7]) for i in range(11)] for row in padded])
    np.testing.assert_array_equal(alignment.median_filter(x), by_hand)


def test_the_heads_that_follow_the_sound_latest_are_the_published_ones(whisper, heard):
    """From attention alone, on each clip (eSpeak's and a natural recording): at least 6 of the 8
    top-ranked heads are among the 8 published alignment heads (chance: 2.7). The ranking is
    recomputed here by hand from the two scores: the 12 heads of least disagreement, latest first."""
    for name in CLIPS:
        disagreement, lag = alignment.head_scores(heard[name])
        h = alignment.Hearing(None, name, 1.0, "", (), disagreement, lag, whisper.alignment_heads, None)
        following = np.argsort(disagreement.ravel(), kind="stable")[:12]
        latest = following[np.argsort(-lag.ravel()[following], kind="stable")][:8]
        assert h.found == [(int(i) // 6 + 1, int(i) % 6 + 1) for i in latest]
        assert h.precision >= 6, (name, h.found)
        assert h.chance == pytest.approx(8 * 8 / 24)


def test_the_lag_is_a_token_the_read_heads_listen_to_the_token_before(heard):
    """Why the latest heads: on each clip, the heads that follow the sound earliest (negative lag),
    moved one token down, land closer to the latest ones than they do on the same token. They
    listen to the token read; the latest, to the token written."""
    for name in CLIPS:
        disagreement, lag = alignment.head_scores(heard[name])
        following = np.argsort(disagreement.ravel(), kind="stable")[:12]
        by_lag = following[np.argsort(-lag.ravel()[following], kind="stable")]
        every = [(i // 6 + 1, i % 6 + 1) for i in range(24)]
        late, early = ([every[i] for i in group] for group in (by_lag[:4], by_lag[-4:]))
        times = [alignment.entries(*alignment.dtw(-alignment.alignment_matrix(heard[name], g)))
                 for g in (late, early)]
        same = np.abs(times[1] - times[0]).mean()
        moved = np.abs(times[1][1:] - times[0][:-1]).mean()
        assert moved < same, (name, moved, same)


@pytest.mark.parametrize("width", [80, 100, 120])
def test_the_hearing_reads_the_same_at_every_width(whisper, golden, width):
    """The layout, on a record of fixed numbers (faster-whisper's word timings from the fixture, a
    grid of known disagreements): a float32 near-tie on another CPU can move a head's path by
    a frame, so the live numbers are checked at a tolerance (below), never as printed digits."""
    import io

    from rich.console import Console

    from mha_trace.models.base import ModelCard

    meta = json.loads(str(REFERENCE["cat_meta"]))
    words = [alignment.Word(w, (), float(a), float(b))
             for w, (a, b) in zip(meta["words"], REFERENCE["cat_words"])]
    tokens = (" The", " cat", " sat", " on", " the", " mat", ".")
    band = np.exp(-0.5 * ((np.arange(103)[None] - 14 * np.arange(8)[:, None] - 7) / 5.0) ** 2)
    record = alignment.Hearing(ModelCard.of(whisper), "examples/audio/cat.wav", 2.0738,
                               meta["text"].strip(), tokens, np.arange(24).reshape(4, 6) / 40 + 0.1,
                               (np.arange(24).reshape(4, 6) % 5 - 2) / 10,
                               whisper.alignment_heads, words, band, alignment.dtw(-band),
                               np.ones(103))
    console = Console(width=width, file=io.StringIO(), color_system=None, legacy_windows=False)
    console.print(record)
    shown = console.file.getvalue()
    assert max(len(line) for line in shown.splitlines()) <= width
    golden(f"whisper_survey_{width}.txt", shown)


def test_survey_hears_a_clip_and_times_its_words(cli, heard):
    result = cli("survey", "--model", "whisper", "--audio", "examples/audio/cat.wav", "--alignment",
                 "--timestamps", "--width", "100")
    assert result.exit_code == 0 and not result.stderr
    assert 'heard examples/audio/cat.wav (2.1 s):\n  "The cat sat on the mat."' in result.stdout
    assert "Precision@8:" in result.stdout and "When each word is said" in result.stdout
    data = json.loads(cli("survey", "--model", "whisper", "--audio", "examples/audio/cat.wav",
                          "--timestamps", "--format", "json").stdout)
    assert data["text"] == "The cat sat on the mat."
    assert [w["word"] for w in data["words"]] == ["The", "cat", "sat", "on", "the", "mat."]
    np.testing.assert_allclose([[w["start"], w["end"]] for w in data["words"]],
                               REFERENCE["cat_words"], atol=0.02 + 1e-9)
    disagreement, lag = alignment.head_scores(heard["cat"])
    np.testing.assert_allclose(data["heads"]["disagreement_seconds"], disagreement, atol=1e-4)
    np.testing.assert_allclose(data["heads"]["lag_seconds"], lag, atol=1e-4)
    assert len(data["heads"]["following"]) == 12
    assert data["heads"]["published"] == ["2.1", "3.1", "3.6", "4.1", "4.2", "4.3", "4.4", "4.5"]
    assert data["heads"]["precision_at_8"] == len(set(data["heads"]["found"]) & set(data["heads"]["published"]))
    assert "words" not in json.loads(cli("survey", "--model", "whisper", "--audio",
                                         "examples/audio/cat.wav", "--format", "json").stdout)


@pytest.mark.parametrize("args,said", [
    (["heads", "--model", "whisper"], "hears audio, not text: mha-trace survey --model whisper --audio"),
    (["explain", "--model", "whisper"], "hears audio, not text"),
    (["survey", "--model", "whisper"], "hears audio, not text"),
    (["survey", "--model", "minilm", "--audio", "examples/audio/cat.wav"], "goes with --model whisper"),
    (["survey", "--timestamps"], "add --model whisper --audio FILE.wav"),
    (["survey", "--model", "whisper", "--audio", "examples/audio/cat.wav", "--induction"],
     "survey of its own"),
    (["survey", "--model", "whisper", "--audio", "README.md"], "not a PCM WAV file"),
    *((["heads", "--model", "whisper", "--audio", "examples/audio/cat.wav", *more, "--png", "x.png"],
       "heads draws in text and JSON; the slide of the cross-attention is survey --model whisper")
      for more in ([], ["--attention", "encoder"])),  # --attention self draws the text views' slides
    (["survey", "--png", "x.png"], "Whisper's alignment slide: it goes with --composition or --audio"),
])
def test_what_whisper_cannot_do_is_refused_in_one_line(cli, args, said):
    result = cli(*args)
    assert result.exit_code == 2 and said in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_the_strip_and_the_slide_show_the_jsons_alignment(cli, heard, whisper, monkeypatch, tmp_path, kept_slides):
    """The text strip has a row for each token and one time axis with the timeline; the slide's
    picture is the JSON's matrix (its token rows) with its path, beside the heads' disagreement,
    the published heads boxed; both themes are one 1920×1080 slide."""
    from PIL import Image

    from mha_trace.render import alignment_slide

    args = ("survey", "--model", "whisper", "--audio", "examples/audio/animal.wav", "--timestamps")
    data = json.loads(cli(*args, "--format", "json").stdout)
    matrix = np.array(data["alignment"]["matrix"])
    np.testing.assert_allclose(matrix, alignment.alignment_matrix(heard["animal"], whisper.alignment_heads),
                               atol=1e-3)
    text = cli(*args, "--width", "100").stdout
    strip = text[text.index("Where each token listens"):text.index("When each word")].splitlines()[4:-1]
    timeline = text[text.index("When each word"):].splitlines()[3:]
    assert [line.split()[0] for line in strip] == [t.strip() for t in data["tokens"]]
    assert len({len(line) for line in timeline}) == 1  # every word on the same axis
    assert max(len(line) for line in strip) <= len(timeline[0])
    made = kept_slides(alignment_slide)
    assert cli(*args, "--png", "w.png").exit_code == 0
    laid_out(made[-1])
    sound, picture, heads = made[-1].axes[:3]
    T = len(data["tokens"])
    np.testing.assert_allclose(picture.get_images()[0].get_array(), matrix[:T], atol=1e-3)
    line = picture.get_lines()[0]
    rows, columns = map(np.array, data["alignment"]["path"])
    np.testing.assert_allclose(line.get_ydata(), rows[rows < T])
    np.testing.assert_allclose(line.get_xdata(), (columns[rows < T] + 0.5) / 50)
    assert [t.get_text() for t in picture.get_yticklabels()] == [t.strip() for t in data["tokens"]]
    np.testing.assert_allclose(heads.get_images()[0].get_array(), data["heads"]["disagreement_seconds"],
                               atol=1e-3)
    boxed = {(round(p.get_y() + 0.45) + 1, round(p.get_x() + 0.45) + 1) for p in heads.patches}
    assert boxed == {tuple(map(int, h.split("."))) for h in data["heads"]["published"]}
    for theme in ("light", "dark"):
        monkeypatch.undo()
        path = tmp_path / f"{theme}.png"
        assert cli(*args, "--png", str(path), "--theme", theme).exit_code == 0
        assert Image.open(path).size == (1920, 1080)


def test_the_api_hears_what_the_command_hears(cli):
    """`mha_trace.model("whisper").hear(FILE)` is the survey's record; the text views and another
    model's hear are refused with one MhaError naming the audio."""
    import mha_trace

    m = mha_trace.model("whisper")
    assert "hears audio" in repr(m)
    r = m.hear(AUDIO / "cat.wav", timestamps=True)
    said = json.loads(cli("survey", "--model", "whisper", "--audio", str(AUDIO / "cat.wav"), "--timestamps",
                          "--format", "json").stdout)
    assert {k: v for k, v in r.data().items() if k != "audio"} == {k: v for k, v in said.items()
                                                                   if k not in ("audio", "schema_version")}
    with pytest.raises(MhaError, match=r'model\("whisper"\).hear\(FILE\)') as e:
        m.heads()
    assert e.value.quantity == "audio"
    with pytest.raises(MhaError, match="goes with --model whisper"):
        mha_trace.model("minilm").hear(AUDIO / "cat.wav")


def test_a_static_cache_keeps_what_it_was_filled_with_and_copies_nothing():
    import torch

    from mha_trace.core.attention import StaticKVCache

    cache, k, v = StaticKVCache(), torch.randn(1, 6, 1500, 64), torch.randn(1, 6, 1500, 64)
    assert cache.append(k, v) == (k, v) and len(cache) == 1500
    got = cache.append(k[:, :, :0], v[:, :, :0])
    assert got[0] is k and got[1] is v  # the same tensors: nothing concatenated


def test_shapes_traces_the_cross_attention_with_its_static_cache(cli, whisper):
    """`shapes --model whisper --audio FILE --layer 4`: the prefill projects the 1,500 frames' K and
    V once; each decoding step hands none, scores T_q = 1 against 1,500 keys and copies no cache;
    every step's output is the decoder's own cross-attention at that position (one full pass)."""
    import torch

    from mha_trace.runs.resolve import RunOptions, resolve

    data = json.loads(cli("shapes", "--model", "whisper", "--audio", "examples/audio/cat.wav", "--layer", "4",
                          "--format", "json").stdout)
    linear = [(s["phase"], s["shape"]) for s in data["steps"] if s["op"] == "linear" and "W_k" in s["text"]]
    assert linear == [("prefill", [1, 1500, 384])] + [(f"decode step {i}", [1, 0, 384]) for i in (1, 2, 3)]
    scores = [s["shape"] for s in data["steps"] if s["op"] == "softmax"]
    assert scores == [[1, 6, 2, 1500]] + [[1, 6, 1, 1500]] * 3
    assert not any(s["op"] == "cat" for s in data["steps"])
    run = resolve(RunOptions(model="whisper", audio="examples/audio/cat.wav", layer=4))
    with torch.no_grad():
        whole = run.module(run.x, run.args[1], run.args[2])[0]  # every position at once, no cache
        outputs = [run.module(*args, **kwargs)[0] for _, args, kwargs in run.phases]
    np.testing.assert_allclose(torch.cat(outputs, 1).numpy(), whole[:, :5].numpy(), atol=1e-5)
    text = cli("shapes", "--model", "whisper", "--audio", "examples/audio/cat.wav").stdout
    assert "StaticKVCache" in text and "KV cache (one layer)" not in text
    for args, said in [(("--layer", "5"), "layers 1 to 4"), (("--decode", "2"), "--decode does not go"),
                       ((), None)]:
        result = cli("shapes", "--model", "whisper", *(["--audio", "examples/audio/cat.wav"] if args else []), *args)
        assert result.exit_code == 2 and (said or "hears audio, not text") in result.stderr


def test_explain_follows_one_token_through_every_cross_attention_head(cli, heard, whisper):
    """`explain --model whisper --audio FILE --token WORD`: each head's weights of the position
    that writes the token (its row of the decoder's cross-attention, over the speech), their
    peaks, and when the word was said as the survey's timings say; bad tokens and options refused."""
    args = ("explain", "--model", "whisper", "--audio", "examples/audio/animal.wav")
    data = json.loads(cli(*args, "--token", "street", "--format", "json").stdout)
    h = heard["animal"]
    assert data["token"] == "street" and data["index"] == 6
    frames = alignment.speech_frames(h)
    row = h.cross_weights[:, :, h.prompt - 1 + 6, :frames]
    np.testing.assert_allclose(data["weights"], row / row.sum(-1, keepdims=True), atol=1e-4)
    assert [x["peak"] for x in data["heads"]] == [round(i / 50, 2) for i in row.reshape(24, -1).argmax(-1)]
    words = {w["word"]: [w["start"], w["end"]] for w in json.loads(cli(
        "survey", "--model", "whisper", "--audio", "examples/audio/animal.wav", "--timestamps",
        "--format", "json").stdout)["words"]}
    assert data["said"] == words["street"]
    assert {x["head"] for x in data["heads"] if x["published"]} == {f"{a}.{b}" for a, b in whisper.alignment_heads}
    text = cli(*args, "--token", "street", "--width", "100").stdout
    assert "Where the position that writes 'street' listens" in text and "4.3*" in text
    assert json.loads(cli(*args, "--position", "0", "--format", "json").stdout)["token"] == "The"
    for extra, said in [(("--token", "cat"), "'cat' is not a token of what Whisper tiny.en heard"),
                        (("--position", "40"), "position 40 is not a text token"),
                        (("--token", "street", "--why"), "--token or --position, and --effect")]:
        result = cli(*args, *extra)
        assert result.exit_code == 2 and said in result.stderr, result.stderr


def test_heads_shows_one_cross_attention_head_token_by_time(cli, heard):
    """`heads --model whisper --audio FILE --head 4.3`: that head's row for each text token (the
    position that writes it) over the speech; other options refused."""
    args = ("heads", "--model", "whisper", "--audio", "examples/audio/animal.wav")
    data = json.loads(cli(*args, "--head", "4.3", "--format", "json").stdout)
    h = heard["animal"]
    T, frames = len(data["tokens"]), alignment.speech_frames(h)
    rows = h.cross_weights[3, 2, h.prompt - 1:h.prompt - 1 + T, :frames]
    np.testing.assert_allclose(data["weights"], rows / rows.sum(-1, keepdims=True), atol=1e-4)
    assert data["published"] and data["tokens"][6] == "street"
    assert data["peaks"] == (rows.argmax(-1) / 50).round(2).tolist()
    assert "Cross-attention head 4.3 (a published alignment head)" in cli(*args, "--head", "4.3").stdout
    assert not json.loads(cli(*args, "--head", "1.1", "--format", "json").stdout)["published"]
    for extra, said in [(("--head", "4.3", "--layer", "4"), "--head L.H alone"), (("--head", "5.1"), "out of range"),
                        (("--head", "4.3", "--overview"), "--head L.H alone")]:
        result = cli(*args, *extra)
        assert result.exit_code == 2 and said in result.stderr, result.stderr


def test_explain_effect_weighs_each_frame_by_what_its_value_moves(cli, heard, whisper):
    """--effect: each head's weight on a frame times ‖v·W_O‖ of that frame's value through the
    head's block of W_O (written out here in NumPy from the layer's parameters), renormalised."""
    data = json.loads(cli("explain", "--model", "whisper", "--audio", "examples/audio/animal.wav", "--token",
                          "street", "--effect", "--format", "json").stdout)
    h = heard["animal"]
    frames = alignment.speech_frames(h)
    encoded = whisper.encode_audio(read_wav(AUDIO / "animal.wav"))[0, :frames].double().numpy()
    weights = h.cross_weights[:, :, h.prompt - 1 + 6, :frames].astype(np.float64)
    weights /= weights.sum(-1, keepdims=True)
    for layer, head in [(1, 3), (4, 3)]:
        a = whisper.decoder.blocks[layer - 1].cross
        v = encoded @ a.W_v.weight.double().detach().numpy().T + a.W_v.bias.double().detach().numpy()
        cols = slice(64 * (head - 1), 64 * head)
        moved = np.linalg.norm(v[:, cols] @ a.W_o.weight.double().detach().numpy()[:, cols].T, axis=1)
        by_hand = weights[layer - 1, head - 1] * moved
        np.testing.assert_allclose(data["effect"][layer - 1][head - 1], by_hand / by_hand.sum(), atol=2e-4)
    assert np.allclose(np.array(data["effect"]).sum(-1), 1, atol=frames * 5e-5)  # each rounded to 4 places
    text = cli("explain", "--model", "whisper", "--audio", "examples/audio/animal.wav", "--token", "street",
               "--effect", "--width", "100").stdout
    assert "by effect (weight × ‖v·W_O‖)" in text


def test_a_second_of_silence_goes_through_every_view(cli, tmp_path):
    """Silence: Whisper writes one token ('.'); no view crashes on one token and 50 frames (fewer
    frames than the time axis has columns)."""
    clip = str(_wav(tmp_path / "silence.wav", np.zeros(RATE)))
    for args in (["survey", "--timestamps", "--png", str(tmp_path / "s.png"), "--html", str(tmp_path / "s.html")],
                 ["explain", "--effect"], ["heads", "--head", "1.1"], ["shapes"]):
        result = cli(args[0], "--model", "whisper", "--audio", clip, *args[1:])
        assert result.exit_code == 0 and "Traceback" not in result.stderr, (args, result.stderr)
    assert json.loads(cli("survey", "--model", "whisper", "--audio", clip, "--format", "json").stdout)["tokens"]


def test_heads_without_head_maps_every_cross_attention_head(cli, heard):
    """`heads --model whisper --audio FILE`: all 24 heads, each row the JSON's weights over the
    speech (the transcription's own, renormalised), the published heads starred after their map,
    at most the width; in the last layer every published head's peaks move forward in time."""
    args = ("heads", "--model", "whisper", "--audio", "examples/audio/animal.wav")
    data = json.loads(cli(*args, "--format", "json").stdout)
    h = heard["animal"]
    T, frames = len(data["tokens"]), alignment.speech_frames(h)
    assert len(data["heads"]) == 24 and data["published"] == ["2.1", "3.1", "3.6", "4.1", "4.2", "4.3", "4.4", "4.5"]
    w = h.cross_weights[3, 2, h.prompt - 1:h.prompt - 1 + T, :frames]
    np.testing.assert_allclose(data["heads"]["4.3"], w / w.sum(-1, keepdims=True), atol=1e-4)
    for name in ("4.1", "4.3", "4.4", "4.5"):
        peaks = np.argmax(data["heads"][name], axis=1)
        assert (np.diff(peaks) >= 0).mean() >= 0.8, name
    result = cli(*args, "--width", "80")
    assert result.exit_code == 0 and not result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    maps = [line for line in lines if line.startswith(("L1", "L2", "L3", "L4"))]
    assert len(maps) == 4 and sum(line.count("*") for line in maps) == 8
    refused = cli(*args, "--overview", "--head", "4.3")
    assert refused.exit_code == 2 and "every one, or --head L.H alone" in refused.stderr


@pytest.mark.parametrize("width", [80, 100, 120])
def test_the_heads_maps_read_the_same_at_every_width(whisper, golden, width):
    """The maps' layout on a record of fixed weights: each head a band that moves down and right
    (later layers narrower), so a dot on another CPU cannot move."""
    import io

    from rich.console import Console

    from mha_trace.models.base import ModelCard

    T, frames = 7, 103
    centre = np.linspace(7, 95, T)[:, None]
    rows = np.stack([np.stack([np.exp(-0.5 * ((np.arange(frames)[None] - centre - 3 * head) / (12 - 2.5 * layer)) ** 2)
                               for head in range(6)]) for layer in range(4)])
    record = alignment.CrossHeads(ModelCard.of(whisper), "examples/audio/cat.wav", 2.0738, "The cat sat on the mat.",
                                  (" The", " cat", " sat", " on", " the", " mat", "."),
                                  rows / rows.sum(-1, keepdims=True), whisper.alignment_heads)
    console = Console(width=width, file=io.StringIO(), color_system=None, legacy_windows=False)
    console.print(record)
    shown = console.file.getvalue()
    assert max(len(line) for line in shown.splitlines()) <= width
    golden(f"whisper_heads_{width}.txt", shown)


def test_why_on_the_cross_attention_splits_the_real_scores_by_both_streams(whisper, heard):
    """`explain --why --head 4.3` on the cross-attention: the text's sources sum to what the
    cross-attention's queries read and the sound's to the encoder's output (the transcription's),
    the terms to q·k/√d_k computed here from the module's weights, and their softmax over the
    1,500 frames is the transcription's weights."""
    import torch

    from mha_trace.analyses.frame_why import SOUND, cross_why
    from mha_trace.models.stream import stream_parts
    from mha_trace.models.transcript import Sound, UpToCross

    h, clip = heard["animal"], "examples/audio/animal.wav"
    c = cross_why(whisper, whisper.heard_file(clip), "street", None, (4, 3))
    row = h.prompt - 1 + c.index
    assert c.token.strip() == "street" and c.published
    np.testing.assert_allclose(c.why.weights(), h.cross_weights[3, 2, row], atol=1e-5)
    t = whisper.reading(whisper.heard_file(clip))
    seen = []
    hook = t.blocks[3].cross.register_forward_pre_hook(lambda m, args: seen.append(args[0][0].double()))
    t.run(list(h.ids))
    hook.remove()
    text = stream_parts(UpToCross(t, 4), list(h.ids), 5)
    sound = stream_parts(Sound(whisper, read_wav(AUDIO / "animal.wav")), list(range(1500)), 5)
    np.testing.assert_allclose(sum(text.values()).numpy(), seen[0].numpy(), atol=1e-4)
    np.testing.assert_allclose(sum(sound.values()).numpy(), h.encoded, atol=1e-4)
    a = t.blocks[3].cross
    with torch.no_grad():
        q = a.W_q(seen[0][row:row + 1].float())[0, 2 * 64:3 * 64].double()
        k = a.W_k(torch.from_numpy(h.encoded))[:, 2 * 64:3 * 64].double()
    np.testing.assert_allclose(c.why.pairs.sum((0, 1)), (k @ q / 8).numpy(), atol=2e-4)
    assert c.why.sources == list(text) + [SOUND + n for n in sound]


def test_explain_why_on_the_cross_attention_shows_frames_and_sources(cli):
    args = ("explain", "--model", "whisper", "--audio", "examples/audio/animal.wav", "--token", "street")
    data = json.loads(cli(*args, "--head", "4.3", "--why", "--format", "json").stdout)
    assert data["head"] == "4.3" and data["published"] and data["token"] == "street"
    assert {w["source"] for w in data["without"]} == set(data["sources"])
    assert data["frames"][0]["time"] == pytest.approx(data["peak"])
    moved = [w["moved"] for w in data["without"]]
    assert moved == sorted(moved, reverse=True) and 0 <= moved[-1] <= moved[0] <= 1
    for frame in data["frames"]:
        assert sum(frame["terms"].values()) == pytest.approx(frame["score"], abs=1e-6)
    shown = cli(*args, "--head", "4.3", "--why", "--width", "100")
    assert shown.exit_code == 0 and "Without each source" in shown.stdout
    assert f"(the real weights)       {data['peak']:.2f}" in shown.stdout
    for extra in (("--why",), ("--why", "--head", "4.3", "--effect"), ("--head", "4.3")):
        refused = cli(*args, *extra)
        assert refused.exit_code == 2 and "or --why with --head L.H" in refused.stderr, extra


def test_the_encoders_heads_are_its_self_attention_among_the_speech_frames(cli, whisper):
    """`heads --attention encoder`: layer 1's weights are NumPy's softmax of the module's own q
    and k over all 1,500 frames (float64, from the sound and the positions), shown over the speech
    renormalised with the share kept; every map and one head's rows through the command."""
    import torch

    from mha_trace.analyses.encoder import encoder_heads

    clip = "examples/audio/cat.wav"
    e = encoder_heads(whisper, whisper.heard_file(clip))
    frames = e.rows.shape[-1]
    block = whisper.encoder.blocks[0]
    with torch.no_grad():
        x = block.attention_norm(whisper.sound(read_wav(AUDIO / "cat.wav")) + whisper.encoder.positions)[0]
        x = x.double().numpy()
    a = block.attention
    p = lambda lin: x @ lin.weight.detach().double().numpy().T + lin.bias.detach().double().numpy()
    q, k = p(a.W_q).reshape(1500, 6, 64), p(a.W_k).reshape(1500, 6, 64)
    s = np.einsum("qhd,khd->hqk", q[:frames], k) / 8
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    speech = w[..., :frames]  # what the 30 s pass puts on the speech
    np.testing.assert_allclose(e.rows[0] * speech.sum(-1, keepdims=True), speech, atol=1e-5)
    np.testing.assert_allclose(e.kept[0], speech.sum(-1).mean(-1), atol=1e-5)
    args = ("heads", "--model", "whisper", "--audio", clip, "--attention", "encoder")
    data = json.loads(cli(*args, "--format", "json").stdout)
    assert np.array(data["bins"]).shape == (4, 6, 20, 20) and data["frames"] == frames
    np.testing.assert_allclose(np.array(data["bins"]).sum(-1), 1, atol=1e-3)
    one = json.loads(cli(*args, "--head", "1.1", "--format", "json").stdout)
    np.testing.assert_allclose(one["weights"], e.rows[0, 0], atol=1e-4)
    shown = cli(*args, "--width", "80")
    assert shown.exit_code == 0 and max(len(line) for line in shown.stdout.splitlines()) <= 80
    assert sum(line.startswith(("L1", "L2", "L3", "L4")) for line in shown.stdout.splitlines()) == 4
    assert "Encoder head 1.1" in cli(*args, "--head", "1.1").stdout
    traced = cli("shapes", "--model", "whisper", "--audio", clip, "--attention", "encoder", "--layer", "2",
                 "--width", "120")
    assert traced.exit_code == 0 and "encoder layer 2 self-attention" in traced.stdout
    assert "[1, 6, 1500, 1500]" in traced.stdout  # every frame's score for every frame, a head


def test_explain_follows_one_frame_through_every_encoder_head(cli, whisper):
    """`explain --attention encoder --token 1.9s`: frame 95's row of every encoder head, the
    heads view's own numbers; --effect is each weight times ‖v_j·W_O‖ of the head's block (by
    hand here, from the layer's normed input), renormalised."""
    import torch

    from mha_trace.analyses.encoder import encoder_heads

    clip = "examples/audio/animal.wav"
    args = ("explain", "--model", "whisper", "--audio", clip, "--attention", "encoder", "--token", "1.9s")
    data = json.loads(cli(*args, "--format", "json").stdout)
    assert data["index"] == 95 and data["token"] == "1.90 s"
    rows = encoder_heads(whisper, whisper.heard_file(clip)).rows
    np.testing.assert_allclose(data["weights"], rows[:, :, 95], atol=1e-4)
    effect = json.loads(cli(*args, "--effect", "--format", "json").stdout)["effect"]
    frames = rows.shape[-1]
    with torch.no_grad():
        block = whisper.encoder.blocks[0]
        x = block.attention_norm(whisper.sound(read_wav(AUDIO / "animal.wav")) + whisper.encoder.positions)[0, :frames]
        v = block.attention.W_v(x).double().numpy()[:, :64]
        moved = v @ block.attention.W_o.weight.double().numpy()[:, :64].T  # head 1's block of W_O
    by_hand = rows[0, 0, 95] * np.linalg.norm(moved, axis=-1)
    np.testing.assert_allclose(effect[0][0], by_hand / by_hand.sum(), atol=1e-4)
    shown = cli(*args, "--width", "100").stdout
    assert "Where the frame at 1.90 s listens, in every encoder head" in shown
    assert "heads peak within 0.1 s of it" in shown
    for extra, said in ((("--why",), "or --why with --head L.H"),
                        (("--position", "5000"), "is not in the speech")):
        refused = cli(*args[:-2], *extra)
        assert refused.exit_code == 2 and said in refused.stderr, refused.stderr


def test_why_on_an_encoder_head_splits_its_real_scores_by_the_sounds_sources(cli, whisper):
    """`explain --attention encoder --token 1.9s --head 1.3 --why`: the terms add up to q·k/√d_k
    computed here from layer 1's own projections of the sound and the positions, their softmax is
    the heads view's row (over the speech), and the command shows and gives them."""
    import torch

    from mha_trace.analyses.encoder import encoder_heads
    from mha_trace.analyses.frame_why import encoder_why

    clip = "examples/audio/animal.wav"
    e = encoder_why(whisper, whisper.heard_file(clip), "1.9s", None, (1, 3))
    assert e.encoder and e.index == 95 and e.why.sources[:2] == ["sound", "position"]
    block = whisper.encoder.blocks[0]
    with torch.no_grad():
        x = block.attention_norm(whisper.sound(read_wav(AUDIO / "animal.wav")) + whisper.encoder.positions)[0]
        q, k = block.attention.W_q(x[95])[128:192].double(), block.attention.W_k(x)[:, 128:192].double()
    np.testing.assert_allclose(e.why.pairs.sum((0, 1)), (k @ q / 8).numpy(), atol=2e-4)
    speech = e.why.weights()[:e.frames]
    np.testing.assert_allclose(speech / speech.sum(), encoder_heads(whisper, whisper.heard_file(clip)).rows[0, 2, 95], atol=1e-5)
    args = ("explain", "--model", "whisper", "--audio", clip, "--attention", "encoder", "--token", "1.9s",
            "--head", "1.3", "--why")
    data = json.loads(cli(*args, "--format", "json").stdout)
    assert data["head"] == "1.3" and data["token"] == "1.90 s" and data["sources"] == e.why.sources
    assert "Encoder head 1.3, the frame at 1.90 s" in cli(*args, "--width", "100").stdout


def test_the_views_of_one_recording_compute_its_encoder_weights_once(whisper, tmp_path):
    """The encoder's weights over all 1,500 frames (about 0.8 s a core) are computed once for the
    last recording asked about: its views in one process (every head, one head, a frame) read that
    computation, read-only; another recording's are computed again, and only the last is kept."""
    from mha_trace.analyses.encoder import encoder_heads, listen_frame

    tone = lambda hz: 0.3 * np.sin(2 * np.pi * hz * np.arange(RATE // 2) / RATE)
    first, second = (whisper.heard_file(_wav(tmp_path / f"{hz}.wav", tone(hz))) for hz in (220, 330))
    ran = []
    hook = whisper.encoder.blocks[0].attention.register_forward_hook(lambda *_: ran.append(1))
    try:
        for heard in (first, second):  # the encoder's pass, kept by recording already
            whisper.encoder_stream(heard.samples)
        ran.clear()
        views = [encoder_heads(whisper, first), encoder_heads(whisper, first, (1, 1)),
                 listen_frame(whisper, first, "0.1", None)]
        assert len(ran) == 1
        np.testing.assert_allclose(views[2].weights, views[0].rows[:, :, 5], atol=1e-6)
        weights, inputs = whisper.encoder_weights(first.samples, views[0].rows.shape[-1])
        assert not weights.flags.writeable and not any(x.flags.writeable for x in inputs)
        encoder_heads(whisper, second)
        encoder_heads(whisper, first, (2, 1))
        assert len(ran) == 3
    finally:
        hook.remove()
