"""The lines a run prints at its end: the references of its data (the floor, else the bigram and unigram
levels the report reads) and, for a resumed segment, the steps it ran itself."""

from __future__ import annotations

from pathlib import Path

from andrea_exp.launch.cli import print_run_summary
from andrea_exp.runs.end_lines import end_of_run_lines

TEXT_RUN = {"run/status": "finished", "run/steps": 600, "run/start_step": 0, "run/wall_s": 12.0,
            "eval/loss_as_trained": 2.1, "data/bigram_xent": 2.4712, "data/unigram_xent": 3.1904,
            "data/log_vocab": 5.5452, "eval/loss_generation": 2.1, "eval/gap": 0.0}


def test_text_shows_the_bigram_and_unigram_levels_instead_of_no_floor():
    line = end_of_run_lines(TEXT_RUN, Path("run"))[1]
    assert line == ("  held-out loss 2.1000 | bigram 2.4712 | unigram 3.1904 | log V 5.5452 (uniform guess) | "
                    "generation loss 2.1000 | gap 0.0000")
    markov = {**TEXT_RUN, "eval/floor": 0.9308}
    assert "| floor 0.9308 | log V" in end_of_run_lines(markov, Path("run"))[1]  # a known floor is the reference
    bare = {k: v for k, v in TEXT_RUN.items() if not k.startswith("data/")}
    assert "| floor n/a | log V n/a" in end_of_run_lines(bare, Path("run"))[1]  # an older summary


def test_a_resumed_segment_says_how_many_steps_it_ran(capsys):
    print_run_summary({**TEXT_RUN, "run/start_step": 327}, Path("run"))
    assert capsys.readouterr().out.splitlines()[0] == (
        "[andrea-exp] finished after 600 steps (273 in this segment, resumed at step 327) in 12.0 s")
    print_run_summary(TEXT_RUN, Path("run"))
    assert capsys.readouterr().out.splitlines()[0] == "[andrea-exp] finished after 600 steps in 12.0 s"
