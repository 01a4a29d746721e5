"""jaxformer-train checks its config values, its launch flags, the mesh and the data files
first: one line naming the key, flag or file, exit 2, nothing prepared, trained or left behind."""

import pathlib
import re
import subprocess
import sys

import pytest

from jaxformer.commands import train

ROOT = pathlib.Path(__file__).parents[2]
# What training.final_alphas must be, as its refusals say.
FINAL_ALPHAS = (
    "a tuple of length penalties (() keeps decoding.alpha), each a finite number from 0 to 4 (above it the length "
    "penalty overflows float32 on a hypothesis of up to 2**31 - 1 tokens, the longest the search counts, and every "
    "hypothesis ranks alike)"
)


def test_a_mesh_that_cannot_hold_the_configured_model_stops_before_data_is_prepared(tmp_path, capsys):
    workdir, data_dir = tmp_path / "run", tmp_path / "data"
    tiny = str(ROOT / "jaxformer" / "configs" / "tiny.py")
    overrides = [f"--config.data.data_dir={data_dir}", "--config.mesh.shape=(1,1,8)"]  # 4 heads over tensor=8
    assert train.main(["--config", tiny, "--workdir", str(workdir), *overrides]) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert re.fullmatch(
        r"error: mesh.shape=\(1, 1, 8\): model.num_heads=4 is not divisible by its mesh axes tensor \(8 ways\), "
        r"which split params/\S+ \(.*\) along dimension \d+; .*",
        error,
    )
    assert not data_dir.exists() and not workdir.exists()  # nothing prepared, trained or left behind


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--config.training.num_train_steps=-5"], "config training.num_train_steps=-5: must be an integer >= 1"),
        (
            ["--config.training.checkpoint_every_steps=0"],
            "config training.checkpoint_every_steps=0: must be an integer >= 1",
        ),
        (
            ["--config.training.label_smoothing=1.5"],
            "config training.label_smoothing=1.5: must be a number in [0.0, 1.0)",
        ),
        (["--config.data.batch_size=0"], "config data.batch_size=0: must be an integer >= 1"),
        (
            ["--config.training.final_choice=True", "--config.training.average_last=5"],
            "config training.average_last=5 with training.keep_checkpoints=3: the final choice averages kept "
            "checkpoints only",
        ),
        (
            ["--config.optimizer.weight_decay=-0.1"],
            "config optimizer.weight_decay=-0.1: must be a finite number >= 0 (0: plain Adam)",
        ),
        (["--config.optimizer.weight_decay=1e999"], "config optimizer.weight_decay=inf: must be a finite number >= 0"),
        (["--config.optimizer.eps=1e999"], "config optimizer.eps=inf: must be a finite number >= 0"),
        (["--config.optimizer.clip_norm=1e999"], "config optimizer.clip_norm=inf: must be a finite number >= 0"),
        (["--config.decoding.alpha=1e999"], "config decoding.alpha=inf: must be a finite number from 0 to 4"),
        (
            ["--config.decoding.alpha=100.0"],
            "config decoding.alpha=100.0: must be a finite number from 0 to 4 (above it the length penalty overflows "
            "float32 on a hypothesis of up to 2**31 - 1 tokens, the longest the search counts, and every hypothesis "
            "ranks alike)\n",
        ),
        (
            ["--config.training.final_alphas=(0.6, 1e39)"],
            "config training.final_alphas=(0.6, 1e+39): must be a tuple of length penalties (() keeps decoding.alpha), "
            "each a finite number from 0 to 4 (above it",
        ),
        # nan and inf were "must be a number": each key's rule now, as a value out of range is told it
        (["--config.optimizer.eps=nan"], "--config.optimizer.eps=nan: must be a finite number >= 0\n"),
        (["--config.optimizer.b1=-Infinity"], "--config.optimizer.b1=-Infinity: must be a number in [0.0, 1.0)\n"),
        (["--config.model.dropout_rate=inf"], "--config.model.dropout_rate=inf: must lie in [0, 1)\n"),
        (
            ["--config.model.layer_norm_epsilon=nan"],
            "--config.model.layer_norm_epsilon=nan: must be a finite number > 0\n",
        ),
        (
            ["--config.model.layer_norm_epsilon=1e999"],
            "config model.layer_norm_epsilon=inf: must be a finite number > 0",
        ),
        (  # was "must be a tuple"
            ["--config.training.final_alphas=(0.6, nan)"],
            "config training.final_alphas=(0.6, nan): must be a tuple of length penalties (() keeps decoding.alpha), "
            "each a finite number from 0 to 4",
        ),
        (
            ["--config.training.final_alphas=(0.6, -inf)"],
            "config training.final_alphas=(0.6, -inf): must be a tuple of length penalties",
        ),
        (  # was "must be a tuple", saying neither of what nor how it is written
            ["--config.training.final_alphas=(0.6, one)"],
            f"--config.training.final_alphas=(0.6, one): must be {FINAL_ALPHAS}, e.g. (1.0, 1.4); one is no value "
            "(a number, a quoted string, True, False or None)\n",
        ),
        (
            ["--config.training.final_alphas=1.0,abc"],
            f"--config.training.final_alphas=1.0,abc: must be {FINAL_ALPHAS}, e.g. (1.0, 1.4); abc is no value "
            "(a number, a quoted string, True, False or None)\n",
        ),
        (
            ["--config.training.final_alphas=1.4"],
            f"--config.training.final_alphas=1.4: must be {FINAL_ALPHAS}, e.g. (1.0, 1.4)\n",
        ),
        (
            ["--config.mesh.shape=2"],
            "--config.mesh.shape=2: must be three integers (data, fsdp, tensor), each >= 1 or one of them -1, "
            "e.g. (-1, 1, 1)\n",
        ),
        (
            ["--config.mesh.logical_axis_rules=batch"],
            "--config.mesh.logical_axis_rules=batch: must be a tuple of (logical name, mesh axes) pairs, "
            "e.g. (('batch', ('data', 'fsdp')), ('vocab', 'tensor'))\n",
        ),
        (  # a digit that is not 0-9: was int()'s traceback after the rule let it through
            ["--config.training.init_from=/nonexistent", "--config.training.init_checkpoint=\u00b2"],
            "config training.init_checkpoint='\u00b2': must be 'latest', 'best', 'averaged', 'final' or a step number",
        ),
        (["--config.decoding.method=beem"], "config decoding.method='beem': must be one of 'beam', 'greedy', 'sample'"),
        (
            ["--config.tokenizer.model_type=wordpiece"],
            "config tokenizer.model_type='wordpiece': must be one of 'unigram', 'bpe'",
        ),
        (["--config.mesh.shape=(2,0,1)"], "config mesh.shape=(2, 0, 1): must be three integers"),
        (
            ["--config.data.eval_split=test_2016_flickr"],
            "config data.eval_split='test_2016_flickr' is a test split: a run trains and chooses on its training and "
            "validation splits; score a test set once, at the end, with jaxformer-evaluate --split test_2016_flickr",
        ),
        (["--config.data.train_split=test"], "config data.train_split='test' is a test split"),
        (
            ["--config.data.eval_split=train"],
            "config data.eval_split='train' is data.train_split too: validation is held out of training",
        ),
        (
            ["--config.optimizer.accumulation_steps=3"],
            "config optimizer.accumulation_steps=3 must divide data.batch_size=4",
        ),
        (["--config.data.target_language=en"], "config data.source_language and data.target_language are both 'en'"),
        (["--config.model.num_heads=3"], "config model.d_model=32: must be divisible by model.num_heads=3"),
        (
            ["--config.model.matmul_dtype=bf16x"],
            "config model.matmul_dtype='bf16x': must be one of 'float32', 'bfloat16', 'float16' or None",
        ),
        (
            ["--config.model.dtype=bfloat16", "--config.model.matmul_dtype=float32"],
            "config model.matmul_dtype='float32': must not be wider than model.dtype=bfloat16",
        ),
        (["--config.training.num_train_steps=ten"], "--config.training.num_train_steps=ten: must be an integer"),
        (
            ["--config.training.num_train_step=5"],
            "unknown config key 'training.num_train_step'; did you mean training.num_train_steps",
        ),
        (["--config.trainig.seed=1"], "unknown config key 'trainig.seed'; did you mean training.seed"),
        (
            ["--config.data.files=x.tsv"],
            "--config.data.files is a section, not a value: set one of its keys (data.files.test, data.files.train, "
            "data.files.validation)\n",
        ),
        (["--config.model=3"], "--config.model is a section, not a value: set one of its keys (model.activation, "),
        (["--config.training.seed"], "--config.training.seed has no value"),
        (["--num_processes=2"], "--num_processes=2 and --process_id=None: give both"),
        (
            ["--num_processes=2", "--process_id=1"],
            "--num_processes=2 and --process_id=1 need --coordinator_address=host:port (process 0's), or --distributed",
        ),
        (["--coordinator_address=127.0.0.1:1"], "--coordinator_address=127.0.0.1:1 needs --num_processes and"),
        (
            ["--coordinator_address=nohost", "--num_processes=2", "--process_id=0"],
            "--coordinator_address='nohost': must be host:port, e.g. 10.0.0.2:1234",
        ),
        (  # an empty address was "need --coordinator_address=host:port", as if none were given
            ["--coordinator_address=", "--num_processes=2", "--process_id=0"],
            "--coordinator_address='': must be host:port, e.g. 10.0.0.2:1234",
        ),
        (["--distributed"], "--distributed: cannot join a multi-process run: "),  # no TPU pod or SLURM job here
        (
            ["--config.optimizer.decay_floor=0.5"],
            "config optimizer.decay_floor=0.5 applies to optimizer.schedule='budget', not 'rsqrt'\n",
        ),
        (
            ["--config.optimizer.schedule=budget", "--config.training.num_train_steps=40"],
            "config training.num_train_steps=40 ends within optimizer.warmup_steps=",
        ),
        (["--config.data.name=bogus_ds"], "data.name='bogus_ds' names no dataset"),
        (
            ["--config.mesh.logical_axis_rules=(('batch','data'),('embed','fdsp'))"],
            "mesh.logical_axis_rules: 'embed' -> 'fdsp' is no mesh axis; the mesh has data, fsdp, tensor\n",
        ),
        (
            ["--config.mesh.logical_axis_rules=(('batch',('data','data')),('vocab','tensor'))"],
            "mesh.logical_axis_rules: 'batch' -> ('data', 'data') names the mesh axis 'data' twice; name each mesh "
            "axis once in a rule\n",
        ),
        (
            ["--config.mesh.logical_axis_rules=(('batch','data'),('emebd','fsdp'))"],
            "mesh.logical_axis_rules: 'emebd' is no logical axis name (did you mean 'embed'?); the models use batch,",
        ),
        (["--config.data.data_dir=/proc/jaxformer-data"], "data.data_dir='/proc/jaxformer-data': /proc takes no new"),
        (
            ["--config.decoding.max_extra_length=1000000000"],
            "config decoding.max_extra_length=1000000000: must be an integer from 1 to 4096\n",
        ),
        (  # was an OverflowError from jit once the run had started
            ["--config.training.seed=2147483648"],
            "config training.seed=2147483648: must be an integer from 0 to 2147483647\n",
        ),
        (  # each split key named, before the workdir is made (was the split alone, once the run had started)
            ["--config.data.eval_split=x", "--config.data.batch_size=8"],  # a row per simulated device
            "config data.eval_split='x': dataset 'multi30k' has no split 'x'; it has train, validation, test_2016",
        ),
        (
            ["--config.data.train_split=x", "--config.data.batch_size=8"],
            "config data.train_split='x': dataset 'multi30k' has no split 'x'; it has",
        ),
        (  # parallel_files' splits are its files' (and validation): known before they are read
            [
                "--config.data.name=parallel_files",
                "--config.data.files.train=absent.tsv",
                "--config.data.eval_split=dev",
                "--config.data.batch_size=8",
            ],
            "config data.eval_split='dev': dataset 'parallel_files' has no split 'dev'; it has train, validation\n",
        ),
    ],
)
def test_bad_config_values_are_one_line_before_any_work(overrides, message, tmp_path, capsys):
    workdir = tmp_path / "run"
    assert (
        train.main(["--config", str(ROOT / "jaxformer" / "configs" / "tiny.py"), "--workdir", str(workdir), *overrides])
        == 2
    )
    error = capsys.readouterr().err
    assert error.startswith(f"error: {message}") and error.count("\n") == 1, error
    assert not workdir.exists()


def test_train_names_a_missing_config_file_in_one_line(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "--config",
            str(tmp_path / "nope.py"),
            "--workdir",
            str(tmp_path / "w"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr == f"error: config file {tmp_path / 'nope.py'} does not exist\n"
    assert not (tmp_path / "w").exists()


def test_bad_data_files_leave_no_workdir_behind(tmp_path, capsys):
    (tmp_path / "short.en").write_text("One.\nTwo.\n")
    (tmp_path / "short.de").write_text("Eins.\n")
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    for files, message in (
        (str(tmp_path / "absent.{lang}"), "absent.en"),
        (str(tmp_path / "short.{lang}"), "line counts differ"),
    ):
        for workdir in (tmp_path / "run", existing):
            flags = ["--config", "tiny", "--workdir", str(workdir), "--config.data.name=parallel_files"]
            flags += [f"--config.data.files.train={files}", f"--config.data.data_dir={tmp_path / 'tfds'}"]
            assert train.main([*flags, "--config.data.batch_size=8"]) == 2  # a row per simulated device
            error = capsys.readouterr().err.splitlines()[-1]  # after the config and devices lines
            assert error.startswith("error: ") and message in error, error
    assert not (tmp_path / "run").exists()  # made by the run, holding nothing: removed
    assert sorted(p.name for p in existing.iterdir()) == ["notes.txt"]  # the user's: left as it was


@pytest.mark.parametrize(
    "flags, refusal",
    [
        (["--num_processes=two", "--process_id=0"], "argument --num_processes: must be an integer >= 1, got 'two'"),
        (["--num_processes=0", "--process_id=0"], "argument --num_processes: must be an integer >= 1, got 0"),
        (["--num_processes=2", "--process_id=-1"], "argument --process_id: must be an integer >= 0, got -1"),
    ],
)
def test_the_launch_flags_numbers_are_refused_as_every_commands_are(flags, refusal, capsys):
    """argparse's own "invalid int value: 'two'" was the one integer flag worded apart from the others."""
    argv = ["--config", "tiny", "--workdir", "w", "--coordinator_address=127.0.0.1:1234", *flags]
    assert train.main(argv) == 2
    assert capsys.readouterr().err == f"error: {refusal}; see {train.build_parser().prog} --help\n"
