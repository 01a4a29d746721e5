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


def run_serve_py(directory, *args, input: str | bytes, timeout: int = 300, **options) -> subprocess.CompletedProcess:
    """`python DIRECTORY/serve.py ARGS < input`, finished; text in and out unless `input` is bytes;
    `options`: subprocess.run's others (cwd, env)."""
    return subprocess.run(
        [sys.executable, str(directory / "serve.py"), *map(str, args)],
        input=input,
        capture_output=True,
        text=isinstance(input, str),
        timeout=timeout,
        **options,
    )


class UpperCase:
    """Stands in for an export's model where what is tested is serve.py's writing."""

    @staticmethod
    def translate(sentences):
        return [sentence.upper() for sentence in sentences]
