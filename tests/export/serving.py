"""Running an export's serve.py in a subprocess in which jaxformer cannot be imported."""

import subprocess
import sys

BLOCK_JAXFORMER = 'import sys\nsys.modules["jaxformer"] = None  # imports of jaxformer fail\n'


def serve_without_jaxformer(script: str, exported, results) -> subprocess.Popen:
    """Starts `script` (Python source, given sys.argv [exported, results]) after blocking every
    import of jaxformer; the caller computes its references meanwhile, then communicates."""
    return subprocess.Popen(
        [sys.executable, "-c", BLOCK_JAXFORMER + script, str(exported), str(results)],
        cwd=results,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
