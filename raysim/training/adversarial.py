"""Local training of a class-conditional GAN on a client's images (FedGAN's local steps):
alternating discriminator and generator steps with the non-saturating loss of Goodfellow et
al. (2014), Adam as in DCGAN (Radford et al. 2016)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from raysim.models.conditional_gan import ConditionalGenerator, ProjectionDiscriminator


@dataclass(frozen=True)
class AdversarialSettings:
    """Steps, batch and Adam settings of one client's GAN training in a round."""

    steps: int
    batch_size: int
    lr: float = 2e-4
    betas: tuple[float, float] = (0.5, 0.999)


def train_gan(generator: ConditionalGenerator, discriminator: ProjectionDiscriminator,
              images: torch.Tensor, labels: torch.Tensor, settings: AdversarialSettings,
              draws: torch.Generator) -> tuple[float, float]:
    """Train both networks in place on ``images`` (in [-1, 1] pixel scale) with their
    ``labels``: per step a real batch, fake images of the batch's labels, one discriminator
    step (real -> 1, fake -> 0) and one generator step (fake -> 1). Fresh Adam states every
    call. Returns the last step's (discriminator, generator) losses."""
    generator.train()
    discriminator.train()
    optimise_d = torch.optim.Adam(discriminator.parameters(), lr=settings.lr, betas=settings.betas)
    optimise_g = torch.optim.Adam(generator.parameters(), lr=settings.lr, betas=settings.betas)
    d_loss = g_loss = torch.zeros(())
    for _ in range(settings.steps):
        rows = torch.randint(len(images), (min(settings.batch_size, len(images)),),
                             generator=draws).to(images.device)
        real, y = images[rows], labels[rows]
        fake = generator(generator.noise(len(y), draws), y)
        real_logits = discriminator(real, y)
        fake_logits = discriminator(fake.detach(), y)
        d_loss = (F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits))
                  + F.binary_cross_entropy_with_logits(fake_logits,
                                                       torch.zeros_like(fake_logits)))
        optimise_d.zero_grad(set_to_none=True)
        d_loss.backward()
        optimise_d.step()
        fooled = discriminator(fake, y)
        g_loss = F.binary_cross_entropy_with_logits(fooled, torch.ones_like(fooled))
        optimise_g.zero_grad(set_to_none=True)
        g_loss.backward()
        optimise_g.step()
    return float(d_loss.detach()), float(g_loss.detach())
