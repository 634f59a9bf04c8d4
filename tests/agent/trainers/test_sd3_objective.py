"""The builtin trainer's SD3 objective (trainers/builtin/sd3.py): the SD3 paper's rectified flow by
default, and --weighting-scheme / --precondition-outputs drawing and weighting as the diffusers SD3
scripts do (their diffusers.training_utils functions, compared draw for draw). Fast: no model loads;
one step's loss is taken through the trainer's own backward pass on a stand-in transformer."""

from __future__ import annotations

import argparse
import math

import pytest
import torch

from sdcloud_agent.trainers.builtin import sd3
from sdcloud_agent.trainers.builtin.arguments import build_parser, parse_args

DIFFUSERS_SCHEMES = ("sigma_sqrt", "logit_normal", "mode", "cosmap")  # train_dreambooth_lora_sd3.py's choices


def test_the_parser_offers_the_diffusers_schemes_and_none():
    from sdcloud_agent.trainers import options

    sd3_script = options.script_options("diffusers", "train_dreambooth_lora_sd3.py")
    assert sd3_script["--weighting_scheme"] == "str:" + "|".join(DIFFUSERS_SCHEMES)
    assert set(sd3.WEIGHTING_SCHEMES) == {*DIFFUSERS_SCHEMES, "none"}
    for scheme in sd3.WEIGHTING_SCHEMES:
        assert parse_args(["--steps", "1", "--weighting-scheme", scheme]).weighting_scheme == scheme
    a = parse_args(["--steps", "1"])
    assert a.weighting_scheme == "logit_normal" and a.precondition_outputs is False  # the SD3 paper's loss
    assert parse_args(["--steps", "1", "--precondition-outputs"]).precondition_outputs is True

    class Refusing(argparse.ArgumentParser):
        def error(self, message):
            raise ValueError(message)

    parser = build_parser()
    parser.__class__ = Refusing
    with pytest.raises(ValueError, match="invalid choice: 'uniform'"):
        parse_args(["--steps", "1", "--weighting-scheme", "uniform"], parser)


@pytest.mark.parametrize("scheme", ["mode", "none", "sigma_sqrt", "cosmap", "logit_normal"])
def test_each_scheme_draws_and_weights_as_diffusers_does(scheme):
    from diffusers.training_utils import compute_density_for_timestep_sampling, compute_loss_weighting_for_sd3

    ours = sd3.timestep_density(torch, scheme, 64, torch.Generator().manual_seed(7), "cpu")
    theirs = compute_density_for_timestep_sampling(scheme, 64, logit_mean=0.0, logit_std=1.0, mode_scale=sd3.MODE_SCALE,
                                                   generator=torch.Generator().manual_seed(7))
    if scheme == "logit_normal":  # the same density; our draw is randn's, theirs normal(0, 1)'s
        assert float(ours.min()) > 0 and float(ours.max()) < 1 and abs(float(torch.logit(ours).mean())) < 0.4
    else:
        assert torch.allclose(ours, theirs), scheme
    sigmas = torch.linspace(0.01, 0.99, 50).view(-1, 1, 1, 1)
    assert torch.allclose(sd3.loss_weighting(torch, scheme, sigmas).float(),
                          compute_loss_weighting_for_sd3(scheme, sigmas).float()), scheme


def test_preconditioning_weights_the_velocity_error_by_sigma_squared():
    g = torch.Generator().manual_seed(1)
    x, noise, v = (torch.randn((3, 4, 2, 2), generator=g) for _ in range(3))
    sigmas = torch.tensor([0.1, 0.5, 0.9]).view(-1, 1, 1, 1)
    noisy = (1 - sigmas) * x + sigmas * noise
    pred, target, w = sd3.flow_matching_terms(torch, "logit_normal", True, v, noisy, x, noise, sigmas)
    assert torch.allclose(w * (pred - target) ** 2, sigmas ** 2 * (v - (noise - x)) ** 2, atol=1e-6)
    pred, target, w = sd3.flow_matching_terms(torch, "logit_normal", False, v, noisy, x, noise, sigmas)
    assert torch.equal(target, noise - x) and torch.equal(w, torch.ones_like(sigmas))


class _Transformer(torch.nn.Module):
    """Stands in for the MMDiT: a velocity that depends on the input and one trainable scale."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, hidden_states, timestep, encoder_hidden_states, pooled_projections, return_dict=False):
        return (hidden_states * self.scale,)


def _trainer(scheme: str, precondition: bool):
    from sdcloud_agent.trainers.builtin.loop import Trainer

    t = object.__new__(Trainer)  # the step's parts only: no model is loaded
    t.torch, t.device, t.scaler, t.autocast_dtype = torch, torch.device("cpu"), None, None
    t.args = argparse.Namespace(weighting_scheme=scheme, precondition_outputs=precondition)
    t.unet, t.scaling, t.latent_shift = _Transformer(), 1.0, 0.0
    t.sd3_sigmas = torch.linspace(1.0, 0.001, 1000)
    t.sd3_timesteps = t.sd3_sigmas * 1000
    t.text_embeds, t.pooled = [torch.zeros(1, 2, 4)], [torch.zeros(1, 4)]
    return t


@pytest.mark.parametrize("scheme, precondition", [("logit_normal", False), ("cosmap", True), ("mode", False)])
def test_one_step_takes_the_loss_its_flags_name(scheme, precondition):
    """The trainer's own backward pass: the loss is the scheme's weighted error of the scheme's draw,
    from the step's generator in the order the trainer draws (latent, noise, sigma)."""
    mean, std = torch.randn(1, 4, 2, 2), torch.zeros(1, 4, 2, 2)
    t = _trainer(scheme, precondition)
    loss = t._sd3_backward(mean, std, [0], torch.Generator().manual_seed(3), per_step=1)

    g = torch.Generator().manual_seed(3)
    x = mean + std * torch.randn(mean.shape, generator=g)
    noise = torch.randn(x.shape, generator=g)
    u = sd3.timestep_density(torch, scheme, 1, g, "cpu")
    sigma = t.sd3_sigmas[(u * 1000).long().clamp(max=999)].view(-1, 1, 1, 1)
    noisy = (1 - sigma) * x + sigma * noise
    v = noisy * 0.5
    err = (noisy - sigma * v - x) if precondition else (v - (noise - x))
    weight = {"cosmap": 2 / (math.pi * (1 - 2 * sigma + 2 * sigma ** 2)), "logit_normal": 1.0, "mode": 1.0}[scheme]
    assert loss == pytest.approx(float((weight * err ** 2).mean()), rel=1e-5)
    assert t.unet.scale.grad is not None  # it went backward
