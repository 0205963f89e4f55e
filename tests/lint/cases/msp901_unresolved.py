# lint-args: --select MSP901
import torch


class MLP(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        self.act = act
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x).view(2, -1)
        return self.act(y) + torch.relu(y) + len(y.shape)
