"""Dataset condensation by distribution matching (FedDM, FedVCK): differentiable siamese
augmentation, MMD kernels, model-guided importance sampling and the matching loop."""
