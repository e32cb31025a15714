"""Digits classification under torchrun. train_ddp.py is a plain DDP script; train_dra.py is the
same script ported to dra, six lines changed (docs/guide/elastic.md shows the diff).

torchrun --nproc-per-node=2 examples/ddp/train_ddp.py --epochs 3 --out out/ddp
torchrun --nproc-per-node=2 examples/ddp/train_dra.py --epochs 3 --out out/dra
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from dra.elastic import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from dra.elastic import DistributedSampler
import dra


def digits():
    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    return TensorDataset(x, torch.tensor(data.target))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    parser.add_argument("--out", default="out/ddp")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    dataset = digits()
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model = DDP(model, optimizer, sampler)
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            dra.step(loss)
        if model.controller.is_leader:
            os.makedirs(args.out, exist_ok=True)
            torch.save(model.module.state_dict(), os.path.join(args.out, f"model-{epoch}.pt"))
            print(json.dumps({"epoch": epoch, "loss": loss.item()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
