"""The job search's ``--fp8``, ``--ep-overlap`` and ``--moe-max-nodes`` (experiments.commands.job_search)."""

from __future__ import annotations

import argparse

import pytest

from experiments.commands.job_search import add_job_arguments, config_from_args, main


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="deepseek-v3")
    parser.add_argument("--gpu", default="h800")
    parser.add_argument("--seq-len", type=int, default=4096)
    add_job_arguments(parser)
    return parser.parse_args(["--gpus", "2048", "--global-batch", "15360", *extra])


def test_the_flags_reach_the_searched_and_the_reference_degrees() -> None:
    cfg = config_from_args(_args("--fp8", "--ep-overlap", "1", "--moe-max-nodes", "4", "--reference",
                                 "tp1,pp16,dp128,ep64,1f1b"))
    assert (cfg.fp8, cfg.ep_overlap, cfg.moe_max_nodes) == (True, 1.0, 4)
    par = cfg.reference.par
    assert (par.fp8, par.ep_overlap, par.moe_max_nodes) == (True, 1.0, 4)
    plain = config_from_args(_args())
    assert (plain.fp8, plain.ep_overlap, plain.moe_max_nodes) == (False, 0.0, 0)


@pytest.mark.parametrize("flag,value", [("--ep-overlap", "1.5"), ("--ep-overlap", "all"), ("--moe-max-nodes", "-1")])
def test_bad_values_are_one_line_naming_the_flag(flag: str, value: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--model", "deepseek-v3", "--gpus", "2048", "--global-batch", "15360", flag, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert flag in err and value in err


def test_fp8_on_an_a100_is_refused_naming_the_field(capsys) -> None:
    code = main(["--model", "deepseek-large", "--gpu", "a100", "--gpus", "16", "--global-batch", "32", "--fp8",
                 "--calls-per-config", "10", "--tune-top", "1", "--microbatch-sizes", "1", "--max-cp", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert "field 'fp8'" in err and "A100" in err
