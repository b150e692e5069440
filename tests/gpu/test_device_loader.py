"""DeviceLoader on a GPU: the samples of ImageTensorDataset on the CPU, bit for bit."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import equal_to_image_tensor_dataset


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("normalise_once", [True, False])
def test_normalisation_on_a_gpu_equals_image_tensor_dataset_on_the_cpu(normalise_once):
    equal_to_image_tensor_dataset("cuda", normalise_once, n=3000)
