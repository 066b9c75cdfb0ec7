"""experiments.commands.job_search: the job search's command line (``search --gpus N --global-batch B``)."""

from __future__ import annotations

import argparse
import json

from experiments.commands.job_search import add_job_arguments, main, run_job


def test_run_job_prints_json_rows_and_writes_the_plan(tmp_path, capsys) -> None:
    assert main(["--model", "llama-control", "--gpus", "8", "--global-batch", "16", "--seq-len", "1024",
                 "--calls-per-config", "40", "--tune-top", "1", "--microbatch-sizes", "1", "--max-cp", "1",
                 "--json", "--out", str(tmp_path)]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert lines[-1]["summary"] is True and lines[-1]["best"]["tp"] >= 1
    for name in ("plan.json", "plan.csv", "job_rows.jsonl", "job.json", "megatron_args.txt"):
        assert (tmp_path / name).exists(), name
    job = json.loads((tmp_path / "job.json").read_text())
    args = (tmp_path / "megatron_args.txt").read_text().splitlines()
    source = job if job["exports"]["megatron_args.txt"] == "the best plan" else lines[-1]["megatron_best"]
    assert f"--tensor-model-parallel-size {source['tp']}" in args
    assert "--global-batch-size 16" in args


def test_run_job_needs_gpus_and_batch(capsys) -> None:
    parser = argparse.ArgumentParser()
    add_job_arguments(parser)
    args = parser.parse_args(["--gpus", "8"])
    assert run_job(args) == 2
    assert "--global-batch" in capsys.readouterr().err
