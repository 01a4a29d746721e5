import jax
import jaxtyping
import pytest

from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint
from tests.conftest import make_workdir
from tests.export.exports import FLAGS, export_with_the_command


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


@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
    """A run with a latest and a different best checkpoint (its parameters scaled by 1.5)."""
    workdir, _, _ = make_workdir(tmp_path_factory.mktemp("export") / "run")
    step, metadata, params = load_checkpoint(workdir)
    best = Checkpointer(RunDirectory(workdir).best, keep=None)
    best.save_params(step, jax.tree.map(lambda leaf: leaf * 1.5, params), metadata.replace(bleu=12.5))
    best.close()
    return workdir


@pytest.fixture(scope="session")
def exported(workdir):
    """The export, written by the installed command as a user runs it; shared by the test files
    (read-only: a test that changes an export changes a copy)."""
    output = workdir.parent / "export"
    assert "cpu, cuda, tpu" in export_with_the_command(workdir, output, FLAGS).stdout
    return output
