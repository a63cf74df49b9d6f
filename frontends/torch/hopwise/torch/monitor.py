"""Where each step's time goes, on a hopwise group: hopwise.torch.Monitor.

    mon = hopwise.torch.Monitor(interval="10s", util_alert=0.5, metrics_file="/var/lib/node_exporter/job.prom")
    for x, y in loader:
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        mon.step()                      # every rank, after each optimizer step
    mon.finish()                        # every rank: the last interval's line and files

Each step takes the group's calls since the last one (DDP's buckets, a hook's, any other): their times on hopwise's
progress thread are the buckets' times, and the wait from the last call until all had finished is the exposed
communication. Rank 0 prints a line per interval (utilization, exposed ms, the slowest rank and its lag, bytes per
second by link), an alert when utilization stays below util_alert for alert_after intervals naming the likely
cause, and rewrites the Prometheus textfile (metrics_file) and the JSON lines (metrics_json). HOPWISE_MONITOR,
HOPWISE_UTIL_ALERT, HOPWISE_METRICS_FILE and HOPWISE_METRICS_JSON give the defaults.
"""
import os

from . import _C


class Monitor:
    def __init__(self, process_group=None, interval=None, every=None, alert_after=None, util_alert=None,
                 metrics_file=None, metrics_json=None, job="torch"):
        import torch.distributed as dist

        group = dist.distributed_c10d._get_default_group() if process_group is None else process_group
        spec = os.environ.get("HOPWISE_MONITOR", "") or "interval=10s"
        fields = dict(item.split("=", 1) for item in spec.split(",") if "=" in item)
        for name, value in (("interval", interval), ("every", every), ("alert_after", alert_after)):
            if value is not None:
                fields[name] = str(value)
        spec = ",".join(f"{k}={v}" for k, v in fields.items())
        threshold = -1.0 if util_alert is None else float(util_alert)
        self._m = _C.Monitor(group, spec, threshold, metrics_file or "", metrics_json or "", job)

    def step(self):
        """Ends a step (call it on every rank after optimizer.step())."""
        self._m.step()

    def finish(self):
        """Reports the last interval and writes the files (every rank, once, at the end)."""
        self._m.finish()

    def last_sample(self):
        """This rank's figures of the last step: step_ms, compute_ms, exposed_ms, bucket_ms."""
        return self._m.last_sample()

    @property
    def reports(self):
        """Rank 0: each interval's figures (means per step per rank, the slowest rank, its lag, the line)."""
        return self._m.reports

    @property
    def alerts(self):
        """Rank 0: the alert lines printed."""
        return self._m.alerts
