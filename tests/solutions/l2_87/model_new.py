"""KernelBench level 2, problem 87 (Conv2d_Subtract_Subtract_Mish): the convolution stays on
cuDNN (called from C++, without its bias), and the bias, the two subtractions and Mish run as
one fused pass over the convolution's output, in place, instead of four passes that each read
and write it."""

import solution_ext
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, subtract_value_1, subtract_value_2):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.shift = float(subtract_value_1) + float(subtract_value_2)

    def forward(self, x):
        return solution_ext.forward(x, self.conv.weight, self.conv.bias, self.shift)
