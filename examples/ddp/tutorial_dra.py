"""tutorial_ddp.py ported to dra: six changed lines (docs/guide/elastic.md shows the diff). It runs
unchanged under torchrun and under dra run, grows and shrinks in place and survives the death of
any worker; the leader of the moment writes the snapshots.

dra run --nproc-per-node=2 examples/ddp/tutorial_dra.py --epochs 4 --save-every 1
torchrun --nproc-per-node=2 examples/ddp/tutorial_dra.py --epochs 4 --save-every 1
"""

import argparse
import json
import os

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.distributed import destroy_process_group, init_process_group
from dra.elastic import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from dra.elastic import DistributedSampler
import dra


def ddp_setup():
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")


class Trainer:
    def __init__(self, model, train_data, test_data, optimizer, save_every, snapshot_path):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", self.local_rank) if torch.cuda.is_available() else torch.device("cpu")
        self.model = model.to(self.device)
        self.train_data = train_data
        self.test_data = test_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model, self.optimizer, self.train_data.sampler, device_ids=[self.local_rank] if torch.cuda.is_available() else None)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location=self.device)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at epoch {self.epochs_run}", flush=True)

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.cross_entropy(output, targets)
        loss.backward()
        self.optimizer.step()
        dra.step(loss)
        return loss.item()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(f"[local rank {self.local_rank}] epoch {epoch} | batch size {b_sz} | steps {len(self.train_data)}",
              flush=True)
        self.train_data.sampler.set_epoch(epoch)
        losses = []
        for source, targets in self.train_data:
            source, targets = source.to(self.device), targets.to(self.device)
            losses.append(self._run_batch(source, targets))
        return sum(losses) / max(len(losses), 1)

    def _evaluate(self, epoch):
        self.test_data.sampler.set_epoch(epoch)
        correct = total = 0
        with torch.no_grad():
            for source, targets in self.test_data:
                prediction = self.model(source.to(self.device)).argmax(dim=1)
                correct += int((prediction == targets.to(self.device)).sum())
                total += len(targets)
        return correct, total

    def _save_snapshot(self, epoch):
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "OPTIMIZER_STATE": self.optimizer.state_dict(),
            "EPOCHS_RUN": epoch + 1,
        }
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            loss = self._run_epoch(epoch)
            correct, total = self._evaluate(epoch)
            print(json.dumps({"epoch": epoch, "local_rank": self.local_rank, "loss": loss, "correct": correct,
                              "total": total}), flush=True)
            if self.model.controller.is_leader and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def load_train_objs():
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(len(x), generator=generator)
    train_set = TensorDataset(x[order[:1400]], y[order[:1400]])
    test_set = TensorDataset(x[order[1400:]], y[order[1400:]])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return train_set, test_set, model, optimizer


def prepare_dataloader(dataset, batch_size, workers):
    return DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=torch.cuda.is_available(),
        shuffle=False,
        num_workers=workers,
        sampler=DistributedSampler(dataset),
    )


def main(save_every, total_epochs, batch_size, workers, snapshot_path):
    ddp_setup()
    train_set, test_set, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(train_set, batch_size, workers)
    test_data = prepare_dataloader(test_set, batch_size, workers)
    trainer = Trainer(model, train_data, test_data, optimizer, save_every, snapshot_path)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="a DDP training job in the DDP tutorial's style")
    parser.add_argument("--epochs", type=int, default=4, help="total epochs to train")
    parser.add_argument("--save-every", type=int, default=1, help="a snapshot every this many epochs")
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader worker processes")
    parser.add_argument("--snapshot", default="snapshot.pt")
    args = parser.parse_args()
    main(args.save_every, args.epochs, args.batch_size, args.workers, args.snapshot)
