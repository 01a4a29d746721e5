import jaxtyping
import pytest


@pytest.fixture
def symbolic_shapes_unchecked():
    """Turns off the test session's runtime shape checks (tests/conftest.py) for exports traced
    in-process: jaxformer annotates sizes (lengths, batch sizes) as `int`, and jax.export's
    symbolic dimensions are not ints. The command, run in a subprocess, exports without them, as
    a user's does."""
    previous = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    yield
    jaxtyping.config.update("jaxtyping_disable", previous)
