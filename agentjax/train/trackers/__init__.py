"""The experiment trackers train/tracking.py drives, each registered in TRACKERS:
TensorBoard event files (log.tensorboard), Weights & Biases (log.wandb.mode), MLflow
(log.mlflow.tracking_uri). Each imports its package only when the run makes it."""
from agentjax.train.trackers import mlflow_run, tensorboard_events, wandb_run
from agentjax.train.trackers.base import TRACKERS, Held, RunInfo, Table, Tracker

__all__ = ["TRACKERS", "Held", "RunInfo", "Table", "Tracker", "mlflow_run",
           "tensorboard_events", "wandb_run"]
