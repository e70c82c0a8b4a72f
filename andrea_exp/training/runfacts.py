"""Facts about a run that are not measurements of training (the code's git commit and whether it was
edited, the number of processes, the parameter count, the GPU, torch and CUDA versions, log(vocab)), put in
the summary so a result can be traced to the code and machine that made it; a module of its own because
these ask the outside world (git, the CUDA driver), not the training. The code's facts are runs/code_facts.py's."""

from __future__ import annotations

import math

import torch

from andrea_exp.model.decoder import Andrea
from andrea_exp.runs import metric_keys as K
from andrea_exp.runs.code_facts import code_sha, git_facts
from andrea_exp.training.runtime import Runtime


def run_facts(rt: Runtime, model: Andrea, vocab_size: int) -> dict:
    gpu = torch.cuda.get_device_name(rt.device) if rt.device.type == "cuda" else "cpu"
    # plain str: a TorchVersion in a cell's result would make the sweep's launching process import torch
    version = str(torch.__version__)
    return {K.TRAIN_WORLD_SIZE: rt.world_size, K.MODEL_PARAMS: model.num_params(), K.SYSTEM_GPU: gpu,
            K.SYSTEM_TORCH: version, K.SYSTEM_CUDA: torch.version.cuda,
            K.DATA_LOG_VOCAB: math.log(vocab_size), K.RUN_CODE_SHA: code_sha(), **git_facts()}
