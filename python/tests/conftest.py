import os

import pytest


def default_model_path():
    cache = os.environ.get("VQ_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "veloxquant")
    return os.path.join(cache, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def model():
    """The default model (scripts/setup.sh fetches it); tests that need it skip without it."""
    import veloxquant as vq
    if not os.path.exists(default_model_path()):
        pytest.skip("default model absent (run scripts/setup.sh)")
    vq.set_num_threads(2)
    return vq.Model.load()
