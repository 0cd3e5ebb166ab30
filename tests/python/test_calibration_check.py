"""Issue 18, deliverable 4: a calibration file carries the held-out check made with it (the cache
against fp16 on tokens training did not see); commands that load a calibration whose check is
above the 0.02 KL target print one warning with the numbers and the fix, and run. Files without a
check (version 1) or within the target print nothing. Bad --held-out values are refused."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.python.test_cli_flags_issue26 import NO_MODEL, run, tiny  # noqa: E402,F401 (tiny: the fixture)
from tests.reference.bad_inputs import calibration_bytes, with_float  # noqa: E402


def generate_with(tiny, calib):
    rc, _, err = run("generate", "-m", tiny, "--prompt-ids", "1,2,3", "-n", "2", "-q", "--kv-cache",
                     "vecinfer:d4b8", "--calib", calib)
    assert rc == 0, err
    return [line for line in err.splitlines() if "warning" in line]


def test_a_check_above_the_target_warns_with_its_numbers(tiny, tmp_path):
    bad = tmp_path / "bad.vqcal"
    bad.write_bytes(calibration_bytes(2, 2, 16, check=(1024, 0.35, 0.61, 1.42))[0])
    warnings = generate_with(tiny, bad)
    assert len(warnings) == 1, warnings
    w = warnings[0]
    assert w.startswith("veloxquant: warning: vecinfer:d4b8: its calibration measured KL 0.3500"), w
    for needle in ("top-1 agreement 61.0%", "perplexity +42.00%", "1024 held-out tokens", "0.02",
                   "vecinfer:k=d4b10,v=d8b12", "q8_0"):
        assert needle in w, (needle, w)


def test_the_same_bytes_alternative_is_offered_only_for_d4b8(tiny, tmp_path):
    d4b6 = tmp_path / "d4b6.vqcal"
    d4b6.write_bytes(calibration_bytes(2, 2, 16, key=(4, 6), value=(4, 6), check=(512, 0.2, 0.8, 1.2))[0])
    rc, _, err = run("generate", "-m", tiny, "--prompt-ids", "1,2,3", "-n", "2", "-q", "--kv-cache",
                     "vecinfer:d4b6", "--calib", d4b6)
    assert rc == 0, err
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "vecinfer:d4b6: its calibration measured KL 0.2000" in warnings[0], err
    assert "k=d4b10,v=d8b12" not in warnings[0] and "q8_0" in warnings[0], warnings[0]


def test_no_warning_within_the_target_or_without_a_check(tiny, tmp_path):
    good = tmp_path / "good.vqcal"
    good.write_bytes(calibration_bytes(2, 2, 16, check=(1024, 0.015, 0.96, 1.01))[0])
    assert generate_with(tiny, good) == []
    v1 = tmp_path / "v1.vqcal"
    v1.write_bytes(calibration_bytes(2, 2, 16)[0])  # version 1: no check stored
    assert generate_with(tiny, v1) == []


def test_a_stored_check_that_is_no_measurement_is_refused(tiny, tmp_path):
    nan = tmp_path / "nan.vqcal"
    nan.write_bytes(calibration_bytes(2, 2, 16, check=(1024, float("nan"), 0.9, 1.0))[0])
    rc, _, err = run("generate", "-m", tiny, "--prompt-ids", "1,2,3", "-n", "2", "-q", "--kv-cache",
                     "vecinfer:d4b8", "--calib", nan)
    assert rc == 1 and str(nan) in err and "held-out check kl = nan" in err, err


def test_held_out_flag_is_checked_before_the_model_loads(tmp_path):
    for bad in ("10", "-1", "2000000"):
        rc, _, err = run("calibrate", "-m", NO_MODEL, "--text", NO_MODEL, "-o", tmp_path / "x.vqcal",
                         "--held-out", bad)
        assert rc == 1 and f"--held-out: {bad} must be 0 (no check) or in 64..1048576" in err, err


def test_a_rotated_key_mean_calibration_runs_and_a_bad_one_is_refused(tiny, tmp_path):
    """Calibration file version 3 with a rotated key mean (docs/QUALITY.md) runs on the CPU cache;
    a stored mean that is not finite is refused naming it (the device refusal is tested in C++:
    KeyMean.TheDeviceSaysItDoesNotRunIt)."""
    km = tmp_path / "km.vqcal"
    data, where = calibration_bytes(2, 2, 16, check=(512, 0.01, 0.97, 1.0), key_mean=(16, True, 16))
    km.write_bytes(data)
    assert generate_with(tiny, km) == []
    # layer 1's mean starts after its value codebooks: 2 heads x 16 dims x 4 bytes from the end of layer 1
    mean_at = len(data) - 8 - 8 * 8 - 2 * 16 * 4
    km.write_bytes(with_float(data, mean_at + 4 * 3, float("nan")))
    rc, _, err = run("generate", "-m", tiny, "--prompt-ids", "1,2,3", "-n", "2", "-q", "--kv-cache",
                     "vecinfer:d4b8", "--calib", km)
    assert rc == 1 and "layer 1 key mean[0, 3] = nan" in err, err


def test_bad_key_mean_flag_is_refused(tmp_path):
    rc, _, err = run("calibrate", "-m", NO_MODEL, "--text", tmp_path / "t.txt", "-o", tmp_path / "x.vqcal",
                     "--key-mean", "sideways")
    assert rc != 0 and "--key-mean" in err and "sideways" in err, err
