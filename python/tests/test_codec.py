"""ProductQuantizer and Calibration through the Python package: NumPy in and out."""
import numpy as np
import pytest

import veloxquant as vq


def clustered(n, dim, seed=0):
    """Points near 16 centres: a product quantizer with enough centroids reconstructs them well."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(16, dim)).astype(np.float32)
    return centres[rng.integers(0, 16, n)] + 0.01 * rng.normal(size=(n, dim)).astype(np.float32)


def test_train_encode_decode_roundtrip():
    x = clustered(2048, 32)
    pq = vq.ProductQuantizer(32, sub_dim=4, bits=8)
    assert not pq.trained and pq.codebooks.shape == (0, 0, 4)
    pq.train(x, max_iters=8, seed=3)
    assert pq.trained and pq.n_sub == 8 and pq.code_size == 8
    assert pq.codebooks.shape == (8, 256, 4) and pq.codebooks.dtype == np.float32
    packed = pq.encode(x)
    assert packed.dtype == np.uint8 and packed.shape == (2048, 8)
    y = pq.decode(packed)
    assert y.dtype == np.float32 and y.shape == x.shape
    rel = float(np.sum((x - y) ** 2) / np.sum(x ** 2))
    assert rel < 1e-3, rel
    codes = pq.encode_codes(x)
    assert codes.dtype == np.uint16 and codes.shape == (2048, 8)
    # Packed and unpacked codes are the same codes; 8-bit codes pack one per byte.
    np.testing.assert_array_equal(codes.astype(np.uint8), packed)
    np.testing.assert_array_equal(pq.decode_codes(codes), y)


def test_training_is_deterministic_and_layout_independent():
    x = clustered(1024, 16, seed=1)
    a = vq.ProductQuantizer(16, sub_dim=2, bits=6, granularity="shared")
    b = vq.ProductQuantizer(16, sub_dim=2, bits=6, granularity="shared")
    a.train(x, seed=5)
    # A Fortran-order float64 array is converted once; the result is the same as from the C array.
    b.train(np.asfortranarray(x.astype(np.float64)), seed=5)
    np.testing.assert_array_equal(a.codebooks, b.codebooks)
    assert a.n_books == 1 and a.granularity == "shared"
    np.testing.assert_array_equal(a.encode(x), b.encode(x[:, :]))


def test_from_codebooks_decodes_to_the_centroids():
    books = np.arange(2 * 16 * 4, dtype=np.float32).reshape(2, 16, 4)
    pq = vq.ProductQuantizer.from_codebooks(books, dim=8)
    assert (pq.bits, pq.sub_dim, pq.n_books) == (4, 4, 2)
    out = pq.decode_codes(np.array([[3, 15]], dtype=np.uint16))
    np.testing.assert_array_equal(out[0], np.concatenate([books[0, 3], books[1, 15]]))
    # 4-bit codes: two per byte.
    assert pq.code_size == 1
    np.testing.assert_array_equal(pq.decode(pq.encode(out)), out)


def test_bad_inputs_raise_veloxquant_error():
    with pytest.raises(vq.Error, match="sub_dim"):
        vq.ProductQuantizer(10, sub_dim=4)
    with pytest.raises(vq.Error):
        vq.ProductQuantizer(16, sub_dim=4, bits=13)
    with pytest.raises(vq.Error, match="granularity"):
        vq.ProductQuantizer(16, granularity="everywhere")
    pq = vq.ProductQuantizer(8, sub_dim=4, bits=4)
    with pytest.raises(vq.Error):
        pq.encode(np.zeros((4, 8), np.float32))  # not trained
    pq.train(clustered(256, 8))
    with pytest.raises(vq.Error, match="columns"):
        pq.encode(np.zeros((4, 12), np.float32))
    with pytest.raises(vq.Error, match=">= 2\\^bits"):
        pq.decode_codes(np.array([[1, 16]], dtype=np.uint16))
    bad = clustered(16, 8)
    bad[3, 5] = np.nan
    with pytest.raises(vq.Error):
        pq.encode(bad)
    with pytest.raises(vq.Error):
        vq.ProductQuantizer.from_codebooks(np.zeros((2, 12, 4), np.float32), dim=8)


def recorded(n_layers=2, n_tokens=300, heads=2, head_dim=16, seed=0):
    rng = np.random.default_rng(seed)
    keys = [rng.normal(size=(n_tokens, heads, head_dim)).astype(np.float32) for _ in range(n_layers)]
    values = [rng.normal(size=(n_tokens, heads, head_dim)).astype(np.float32) for _ in range(n_layers)]
    return keys, values


def test_calibration_train_save_load(tmp_path):
    keys, values = recorded()
    cal = vq.Calibration.train(keys, values, kv_cache="vecinfer:d4b8,gran=shared", kmeans_iters=4, model_name="toy")
    assert (cal.n_layers, cal.n_kv_heads, cal.head_dim) == (2, 2, 16)
    assert cal.key_preset == "d4b8" and cal.granularity == "shared" and cal.model_name == "toy"
    s = cal.smoothing(1)
    assert s.shape == (2, 16) and not s.flags.writeable
    # Views of the calibration's own memory: the same buffer each time, no copy.
    assert np.shares_memory(s, cal.smoothing(1))
    # The smoothing factor of a channel is sqrt(max |K_c|) over the tokens left after the 4 sinks.
    np.testing.assert_allclose(s, np.sqrt(np.abs(keys[1][4:]).max(axis=0)), rtol=1e-6)
    assert cal.key_codebooks(0).shape == (2, 1, 256, 4)
    path = str(tmp_path / "toy.vqcal")
    cal.save(path)
    back = vq.Calibration.load(path)
    for layer in range(2):
        np.testing.assert_array_equal(back.key_codebooks(layer), cal.key_codebooks(layer))
        np.testing.assert_array_equal(back.value_codebooks(layer), cal.value_codebooks(layer))
    with pytest.raises(vq.Error, match="layer 2"):
        cal.smoothing(2)


def test_calibration_errors(tmp_path):
    keys, values = recorded(n_tokens=64)
    with pytest.raises(vq.Error, match="vecinfer"):
        vq.Calibration.train(keys, values, kv_cache="kivi2")
    with pytest.raises(vq.Error, match="shape"):
        vq.Calibration.train(keys, [values[0], values[1][:10]])
    (tmp_path / "junk.vqcal").write_bytes(b"not a calibration file")
    with pytest.raises(vq.Error, match="junk.vqcal"):
        vq.Calibration.load(str(tmp_path / "junk.vqcal"))


def test_kv_spec_strings():
    spec = vq.KVSpec("kivi2")
    assert spec.method == "kivi" and spec.name == "kivi2" and spec.calibration is None
    assert vq.KVSpec("q8_0").nominal_bits_per_element == pytest.approx(8.5)
    with pytest.raises(vq.Error, match="calibrate"):
        vq.KVSpec("vecinfer:d4b8")  # no calibration: the message says how to make one
    with pytest.raises(vq.Error):
        vq.KVSpec("vecinfer:d3b8")
    with pytest.raises(vq.Error):
        vq.KVSpec("fp17")
    keys, values = recorded()
    cal = vq.Calibration.train(keys, values, kv_cache="vecinfer:d4b8,gran=shared", kmeans_iters=2)
    spec = vq.KVSpec("vecinfer:d4b8,gran=shared,r=64", cal)
    assert spec.residual_length == 64 and spec.calibration.n_layers == 2
    with pytest.raises(vq.Error, match="vecinfer"):
        vq.KVSpec("fp16", cal)


def test_version_and_threads():
    assert vq.__version__ == vq.version() and vq.version().count(".") == 2
    n = vq.num_threads()
    vq.set_num_threads(1)
    assert vq.num_threads() == 1
    vq.set_num_threads(n)
    with pytest.raises(vq.Error):
        vq.set_num_threads(0)
    assert vq.cuda_available() in (True, False)


def test_sampler_is_seeded_and_greedy_is_argmax():
    logits = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    assert vq.Sampler(temperature=0).sample(logits) == int(np.argmax(logits))
    draws = lambda seed: [vq.Sampler(temperature=1.5, top_k=0, top_p=1.0, min_p=0, seed=seed).sample(logits)
                          for _ in range(3)]
    assert draws(7) == draws(7)
    s = vq.Sampler(temperature=1.5, top_k=0, top_p=1.0, min_p=0, seed=1)
    assert len({s.sample(logits) for _ in range(50)}) > 5  # a real distribution, not argmax
    with pytest.raises(vq.Error):
        s.sample(np.zeros(0, np.float32))


def test_model_load_errors_name_the_file(tmp_path):
    with pytest.raises(vq.Error, match="nope.gguf"):
        vq.Model.load(str(tmp_path / "nope.gguf"))
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + b"\0" * 60)
    with pytest.raises(vq.Error, match="junk.gguf"):
        vq.Model.load(str(tmp_path / "junk.gguf"))


def test_kv_method_list_comes_from_the_registry():
    """The package's method list and spec help are the library's KV method registry."""
    methods = vq.kv_cache_methods()
    for m in ("fp16", "q8_0", "q4_0h", "q5_0", "kivi2", "vecinfer:d4b8"):
        assert m in methods
    assert "q5_0" in vq.KVSpec.__doc__
    assert "vecinfer alone = vecinfer:d4b8" in vq.kv_cache_spec_help()
    assert vq.KVSpec("q5_0").nominal_bits_per_element == 5.5
    with pytest.raises(vq.Error, match="nothing after"):
        vq.KVSpec("vecinfer:")
