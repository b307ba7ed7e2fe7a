"""Audio in: a WAV file read with the standard library, as float32 samples at 16 kHz, mono.

>>> samples = read_wav("examples/audio/cat.wav")
>>> samples.dtype, round(len(samples) / RATE, 2)
(dtype('float32'), 1.89)
"""

import wave
from pathlib import Path

import numpy as np

from mha_trace.errors import MhaError

RATE = 16_000  # what Whisper hears: 16,000 samples a second
MAX_SECONDS = 30.0  # one encoder window
MIN_SECONDS = 0.1  # five encoder frames: less than a syllable, nothing to align


def read_wav(path) -> np.ndarray:
    """The file's samples in [-1, 1] at 16 kHz, channels averaged; another rate is resampled.
    Anything but 8, 16 or 32-bit PCM WAV, shorter than 0.1 s or longer than 30 s, is refused in
    one line."""
    path = _regular(Path(path))
    try:
        with wave.open(str(path), "rb") as w:
            rate, channels, width, count = (w.getframerate(), w.getnchannels(), w.getsampwidth(),
                                            w.getnframes())
            if rate >= 1000 and count > rate * MAX_SECONDS:  # said before 40 minutes are read
                raise MhaError(f"{path} is {count / rate:.1f} s long: Whisper hears at most "
                               f"{MAX_SECONDS:.0f} s at once (cut it shorter)", quantity="audio")
            raw = w.readframes(count)
    except (wave.Error, EOFError, OSError) as e:
        why = (" (it holds float samples; 8, 16 or 32-bit integers are read)" if str(e) == "unknown format: 3"
               else f" ({e})" if str(e) else " (it is empty)" if path.stat().st_size == 0 else "")
        raise MhaError(f"{path} is not a PCM WAV file{why}; convert it, e.g. with: ffmpeg -i "
                       f"{path.name} -ar 16000 -ac 1 out.wav", quantity="audio") from None
    kinds = {1: (np.uint8, 128.0, 128.0), 2: (np.int16, 0.0, 32768.0), 4: (np.int32, 0.0, 2.0**31)}
    if width not in kinds or channels < 1 or rate < 1000:
        raise MhaError(f"{path} is {8 * width}-bit audio at {rate} Hz, {channels} "
                       f"channel{'s' * (channels != 1)}: only 8, 16 or 32-bit PCM at 1000 Hz or "
                       f"more is read", quantity="audio")
    dtype, offset, scale = kinds[width]
    frames = np.frombuffer(raw, dtype=dtype)[: count * channels].reshape(-1, channels)
    samples = ((frames.astype(np.float64) - offset) / scale).mean(axis=1)
    if len(samples) == 0:
        raise MhaError(f"{path} holds no samples", quantity="audio")
    if len(samples) < rate * MIN_SECONDS:
        raise MhaError(f"{path} is {len(samples) / rate:.3f} s long: too short to hear (at least "
                       f"{MIN_SECONDS:g} s)", quantity="audio")
    if len(samples) > rate * MAX_SECONDS:
        raise MhaError(f"{path} is {len(samples) / rate:.1f} s long: Whisper hears at most "
                       f"{MAX_SECONDS:.0f} s at once (cut it shorter)", quantity="audio")
    return resample(samples, rate).astype(np.float32)


def _regular(path: Path) -> Path:
    """The path of a regular file, or one line: a FIFO or a device would block or never end."""
    import stat

    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise MhaError(f"{path}: no such file", quantity="audio") from None
    except OSError as e:
        raise MhaError(f"{path} cannot be read ({e.strerror})", quantity="audio") from None
    if stat.S_ISDIR(mode):
        raise MhaError(f"{path} is a folder, not a WAV file", quantity="audio")
    if not stat.S_ISREG(mode):
        raise MhaError(f"{path} is not a regular file (a pipe or a device): save the sound to a "
                       f"WAV file first", quantity="audio")
    return path


def resample(samples: np.ndarray, rate: int) -> np.ndarray:
    """Band-limited resampling to 16 kHz through the spectrum: frequencies above both rates'
    Nyquist limit are dropped, the rest keep their amplitude and phase."""
    if rate == RATE:
        return samples
    n_out = round(len(samples) * RATE / rate)
    spectrum = np.fft.rfft(samples)
    kept = np.zeros(n_out // 2 + 1, dtype=complex)
    n = min(len(kept), len(spectrum))
    kept[:n] = spectrum[:n]
    return np.fft.irfft(kept, n_out) * (n_out / len(samples))
