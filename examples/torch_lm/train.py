#!/usr/bin/env python3
"""A GPT-style byte-level language model (gpt.py) trained on the Python standard library's sources (corpus.py) with
AdamW, over the backend and method of your choice: DDP on gloo or hopwise (with a hopwise or torch comm hook), an
averaging method, hopwise's DiLoCo, or the plain-PyTorch DiLoCo recipe over gloo. Nothing is downloaded.

    PYTHONPATH=build/python scripts/venv.sh torchrun --standalone --nproc_per_node 2 examples/torch_lm/train.py \\
        --backend hopwise --diloco diloco:period=4,fragments=4,delay=1,codec=int4 --steps 200 --json out.json
    mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 -x PYTHONPATH=build/python \\
        "$(scripts/venv.sh --path)/bin/python" examples/torch_lm/train.py ...
    TRAINER=examples/torch_lm/train.py sbatch examples/slurm/torch_ddp.sbatch --backend hopwise ...

Methods (one at a time): --ddp-hook SPEC (DDP with a hopwise codec, e.g. int8:ef=1 or powersgd:rank=4, backend
hopwise; or torch-fp16, torch-powersgd:rank=4), --averaging SPEC (local:period=H, async:period=H,delay=1,codec=int8,
...: hopwise.torch.ModelAverager around DDP), --diloco SPEC (no DDP: hopwise.torch.DiLoCo around each rank's AdamW),
--recipe H[:int8] (no DDP, no hopwise: scripts/diloco_recipe.py's outer loop over gloo, the peer), --torchft H
(torchft's DiLoCo, torchft_peer.py: run with an interpreter that has torchft). The batch of each step is drawn from
the step and --seed alone, so every method sees the same tokens.

Prints the model and plan, a progress bar, the validation loss in bits per byte every --eval-every steps (off the
clock, the ranks' mean model under every method; a fragment in flight is waited for on the clock first) and, at the
end, a few lines the model writes. --json FILE: step_ms, compute_ms (forward, backward and the AdamW step with no
communication, measured apart), utilization, val_bpb, val_trace [[steps, training seconds, bpb], ...],
tokens_per_s, bytes_per_step (what the method hands its collectives), link_bytes_per_step (on several hosts: what
each rank's share of its host's links sent, evaluations left out; the same count for every row), diloco_stats,
sample. --trace-file FILE: rank 0 appends "WALL_CLOCK STEP BPB" at every evaluation (restarted attempts too).

--elastic STORE (with --diloco; HOPWISE_ELASTIC=shrink[,grow]): a lost or stopped replica is survived without a
restart (hopwise.torch.ElasticContext over the file STORE: the survivors keep DiLoCo's outer state and redo the
broken sync), and a replica started later with HOPWISE_ELASTIC_JOIN=1 joins at a boundary with the synced model,
outer momentum and step (docs/diloco.md, "When a replica is lost, stopped or comes back"). With --replica I/N each
replica is its own launch, e.g. one `torchrun --nproc-per-node 1 --max-restarts 100` per host: torchrun restarts a
replica that died, and it joins the running job."""
import argparse
import contextlib
import copy
import importlib.util
import json
import math
import os
import re
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from corpus import Corpus  # noqa: E402
from gpt import GPT, count, parameter_groups  # noqa: E402


def load_file(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The MLP example's comm hooks and progress bar (examples/torch_ddp/train.py), shared rather than copied.
mlp = load_file("torch_ddp_train", HERE.parent / "torch_ddp" / "train.py")


def arguments():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="hopwise", choices=["hopwise", "gloo"])
    ap.add_argument("--ddp-hook", default="none", help="DDP's comm hook: a hopwise codec spec or torch-fp16, ...")
    ap.add_argument("--averaging", default="sync", help="a hopwise.torch.ModelAverager spec (backend hopwise)")
    ap.add_argument("--diloco", default="", help="a diloco spec: no DDP, hopwise.torch.DiLoCo (backend hopwise)")
    ap.add_argument("--recipe", default="", help="H[:int8]: the plain-PyTorch DiLoCo recipe (backend gloo)")
    ap.add_argument("--torchft", type=int, default=0, help="H: torchft's DiLoCo (backend gloo; torchft installed)")
    ap.add_argument("--fsdp", action="store_true", help="shard with FSDP2 (fully_shard each block, then the model)")
    ap.add_argument("--fsdp-grads", default="none", help="with --fsdp: hopwise codec of the gradients' reduce-scatter")
    ap.add_argument("--fsdp-params", default="none", help="with --fsdp: hopwise codec of the parameters' all-gather")
    ap.add_argument("--outer-lr", type=float, default=0.7, help="the recipe's and torchft's outer learning rate")
    ap.add_argument("--outer-momentum", type=float, default=0.9, help="their outer Nesterov momentum")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8, help="global batch in sequences, split across ranks")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--tokens", type=float, default=0, help="train on this many tokens instead (sets --steps)")
    ap.add_argument("--lr", type=float, default=2e-3, help="AdamW's peak learning rate")
    ap.add_argument("--warmup", type=int, default=30, help="steps of linear warmup, then cosine decay to lr / 10")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0, help="gradient norm clipping (0: none)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=50, help="validation every N steps (0: at the end only)")
    ap.add_argument("--val-windows", type=int, default=64)
    ap.add_argument("--sample", type=int, default=300, help="bytes the model writes at the end (0: none)")
    ap.add_argument("--json", default="")
    ap.add_argument("--monitor", default="", help="hopwise.torch.Monitor's interval, e.g. interval=10s")
    ap.add_argument("--checkpoint", default="", help="PATH: hopwise.torch.Checkpoints files PATH.step<S>.rank<R>")
    ap.add_argument("--checkpoint-every", type=int, default=0)
    ap.add_argument("--resume", default="", choices=["", "auto"],
                    help="auto: start from the newest step every rank holds of --checkpoint's files, if any")
    ap.add_argument("--stop-after", type=int, default=0, help="leave after this many steps (a run cut short)")
    ap.add_argument("--slowdown", default="", help="R:F: rank R's steps take F times as long (a straggler)")
    ap.add_argument("--trace-file", default="", help="rank 0 appends 'WALL_CLOCK STEP BPB' at every evaluation")
    ap.add_argument("--elastic", default="", help="STORE: with --diloco, survive lost replicas and let new ones in")
    ap.add_argument("--replica", default="", help="I/N with --elastic: this replica's place where each replica is "
                                                  "launched on its own (one torchrun per replica)")
    args = ap.parse_args()
    methods = [m for m in (args.ddp_hook != "none", args.averaging != "sync", bool(args.diloco), bool(args.recipe),
                           bool(args.torchft), args.fsdp) if m]
    if len(methods) > 1:
        sys.exit("train.py: one of --ddp-hook, --averaging, --diloco, --recipe, --torchft, --fsdp at a time")
    compress = (args.fsdp_grads, args.fsdp_params) != ("none", "none")
    if compress and not args.fsdp:
        sys.exit("train.py: --fsdp-grads and --fsdp-params compress FSDP2's collectives: add --fsdp")
    if compress and args.backend != "hopwise":
        sys.exit("train.py: --fsdp-grads and --fsdp-params run over hopwise: --backend hopwise")
    if args.fsdp and args.checkpoint:
        sys.exit("train.py: --fsdp runs without --checkpoint (FSDP2's sharded state saves through "
                 "torch.distributed.checkpoint, which this example leaves out)")
    if (args.averaging != "sync" or args.diloco) and args.backend != "hopwise":
        sys.exit("train.py: --averaging and --diloco run over hopwise: --backend hopwise")
    if (args.recipe or args.torchft) and args.backend != "gloo":
        sys.exit("train.py: --recipe and --torchft are the peers, over gloo: --backend gloo")
    if args.torchft and (args.checkpoint or args.monitor):
        sys.exit("train.py: --torchft runs without --checkpoint and --monitor (torchft keeps its own state)")
    if args.torchft < 0:
        sys.exit(f"train.py: --torchft {args.torchft}: the period H is a count of steps, 1 or more")
    if (args.checkpoint_every or args.resume) and not args.checkpoint:
        sys.exit("train.py: --checkpoint-every and --resume auto need --checkpoint PATH")
    if args.replica and (not args.elastic or not re.fullmatch(r"\d+/\d+", args.replica)):
        sys.exit(f"train.py: --replica {args.replica}: write I/N (replica I of N), with --elastic")
    if args.elastic and (not args.diloco or args.checkpoint or args.fsdp):
        sys.exit("train.py: --elastic goes with --diloco (no --checkpoint: the survivors keep the state)")
    if args.slowdown:
        r, _, f = args.slowdown.partition(":")
        try:
            args.slowdown = (int(r), float(f))
        except ValueError:
            sys.exit(f"train.py: --slowdown {args.slowdown}: write RANK:FACTOR, e.g. 2:2 (rank 2 at half speed)")
    if args.tokens:
        args.steps = max(1, int(args.tokens // (args.batch * args.context)))
    return args


def init_distributed(backend, elastic="", replica=""):
    """torchrun sets RANK and WORLD_SIZE; mpirun's and srun's own variables stand in for them (srun: with
    MASTER_ADDR and MASTER_PORT exported). elastic: the group over that file store, its ElasticContext returned."""
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        os.environ.setdefault("RANK", os.environ["OMPI_COMM_WORLD_RANK"])
        os.environ.setdefault("WORLD_SIZE", os.environ["OMPI_COMM_WORLD_SIZE"])
    elif "SLURM_PROCID" in os.environ and "MASTER_ADDR" in os.environ:
        os.environ.setdefault("RANK", os.environ["SLURM_PROCID"])
        os.environ.setdefault("WORLD_SIZE", os.environ["SLURM_NTASKS"])
    if backend == "hopwise":
        import hopwise.torch  # noqa: F401  (registers the backend)
    if elastic:
        os.environ.setdefault("HOPWISE_ELASTIC", "shrink,grow")
        i, _, n = replica.partition("/")
        place = {"replica": int(i), "replicas": int(n)} if replica else {}
        return hopwise.torch.ElasticContext(elastic, **place)
    dist.init_process_group(backend)
    return None


def lr_factor(step, warmup, steps):
    """Linear warmup to 1, then cosine decay to 0.1 at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress)))


def main():
    args = arguments()
    torch.set_flush_denormal(True)  # before any other thread starts (see examples/torch_ddp/train.py)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    ctx = init_distributed(args.backend, args.elastic, args.replica)
    joined = bool(ctx and ctx.joined_late)  # a replica let into the running job: it starts at the members' step
    rank, world = dist.get_rank(), dist.get_world_size()
    lead = rank == 0
    if args.batch % world:
        sys.exit(f"train.py: --batch {args.batch} does not split across {world} ranks")
    hw = None
    if args.backend == "hopwise" or args.checkpoint:
        import hopwise.torch as hw

    corpus = Corpus.load()
    model = GPT(args.layers, args.width, args.heads, args.context, seed=args.seed)
    opt_of = lambda m: torch.optim.AdamW(parameter_groups(m, args.weight_decay), lr=args.lr,  # noqa: E731
                                         betas=(0.9, 0.95))
    avg = diloco = recipe = hook_state = tft = bare = comp = None
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard
        bare = (copy.deepcopy(model),)  # compute alone: an FSDP2 step cannot run without its all-gathers
        bare += (opt_of(bare[0]),)
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        if (args.fsdp_grads, args.fsdp_params) != ("none", "none"):
            comp = hw.fsdp.compress(model, grads=args.fsdp_grads, params=args.fsdp_params)
        net, opt = model, opt_of(model)
    elif args.diloco:  # no DDP: each rank its replica
        net, opt = model, opt_of(model)
        diloco = hw.DiLoCo(model, opt, args.diloco, join=joined)
    elif args.recipe or args.torchft:
        with torch.no_grad():  # every rank starts from rank 0's model, as DDP would make it
            for p in model.parameters():
                dist.broadcast(p, 0)
        net, opt = model, opt_of(model)
        if args.torchft:
            import torchft_peer
            missing = torchft_peer.missing()
            if missing:
                sys.exit(f"train.py: --torchft: {missing}")
            tft = torchft_peer.TorchftDiLoCo(model, opt, args.torchft, args.outer_lr, args.outer_momentum)
        else:
            peer = load_file("diloco_recipe", HERE.parents[1] / "scripts" / "diloco_recipe.py")
            h, _, q = args.recipe.partition(":")
            recipe = peer.DiLoCo(model, int(h), args.outer_lr, args.outer_momentum, q or "none")
    else:
        if args.averaging != "sync":
            avg = hw.ModelAverager(args.averaging, model)  # before DDP: the parameters move to one buffer
        net = DDP(model)
        if avg:
            net.register_comm_hook(*avg.comm_hook())
        else:
            hook_state = mlp.register_hook(net, args.ddp_hook, args.backend)
        opt = opt_of(model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, args.warmup, args.steps))
    params = count(model)
    start = diloco.steps if joined else 0
    if joined:
        with warnings.catch_warnings():  # the schedule to the members' step ("step() before optimizer.step()")
            warnings.simplefilter("ignore")
            for _ in range(start):
                sched.step()

    def survive(call, again=True):
        """call(); under --elastic a collective that fails because a replica was lost or stopped is survived: the
        survivors agree, DiLoCo regroups (its sync redone), and call runs again unless `again` is False."""
        while True:
            try:
                return call()
            except RuntimeError as e:
                if not ctx:
                    raise
                diloco.detach()
                ctx.shrink(str(e))
                said = diloco.regroup()
                if dist.get_rank() == 0:
                    mlp.console_line_open(False)
                    print(f"\ntrain.py: {said}", flush=True)
                if not again:
                    return None

    ckpt = hw.Checkpoints(args.checkpoint) if args.checkpoint else None
    found = ckpt.load_newest() if ckpt and args.resume == "auto" else None
    if found:
        start, state = found
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["schedule"])
        if hook_state is not None:
            hook_state.load_state_dict(state["hook"])
        if avg:
            avg.load_state_dict(state["averager"])
        if diloco:
            diloco.load_state_dict(state["diloco"])  # after the model's own parameters
        if recipe:
            with torch.no_grad():
                for s, saved in zip(recipe.synced, state["recipe"]["synced"]):
                    s.copy_(saved)
            recipe.outer.load_state_dict(state["recipe"]["outer"])
            recipe.since = state["recipe"]["since"]

    def save_checkpoint(step):
        if avg:
            avg.full_average()  # as an uninterrupted run with these flags does too
        ckpt.save(step, {"model": model.state_dict(), "optimizer": opt.state_dict(), "schedule": sched.state_dict(),
                         "hook": hook_state.state_dict() if hook_state is not None else None,
                         "averager": avg.state_dict() if avg else None,
                         "diloco": diloco.state_dict() if diloco else None,
                         "recipe": {"synced": [s.detach().clone() for s in recipe.synced],
                                    "outer": recipe.outer.state_dict(), "since": recipe.since} if recipe else None})

    monitor = None
    if args.backend == "hopwise" and (args.monitor or os.environ.get("HOPWISE_MONITOR")):
        if args.monitor:
            os.environ["HOPWISE_MONITOR"] = args.monitor
        monitor = hw.Monitor(job="torch_lm")
    method = (f"fsdp grads {args.fsdp_grads}, params {args.fsdp_params}" if args.fsdp else
              f"averaging {args.averaging}" if avg else f"diloco {diloco.spec}" if diloco else
              f"recipe {args.recipe}" if recipe else tft.spec if tft else f"ddp hook {args.ddp_hook}")
    if lead:
        print(f"train.py: {world} ranks, backend {args.backend}, {method}; GPT {args.layers} layers x {args.width} "
              f"wide, {args.heads} heads, context {args.context}: {params:,} parameters ({params * 4 / 2**20:.1f} MiB "
              f"of gradients a step); corpus {corpus.name}: {corpus.train.numel():,} train bytes, "
              f"{corpus.validation.numel():,} validation; global batch {args.batch} x {args.context} tokens, "
              f"{args.steps} steps ({args.steps * args.batch * args.context:,} tokens)")
        if args.backend == "hopwise":
            print(hw.plan()["description"].rstrip())
        if joined:
            print(f"train.py: joined the running job at step {start}")
        if found:
            print(f"train.py: resumed at step {start} from {args.checkpoint}")

    def batch(step):  # this rank's share (under --elastic the replicas here share the global batch)
        return corpus.batch(step, args.batch, args.context, dist.get_rank(), dist.get_world_size(), args.seed)

    def train_step(x, y, communicate=True, net=net, opt=opt, model=model):
        started = time.perf_counter()
        opt.zero_grad()
        with contextlib.nullcontext() if communicate or not isinstance(net, DDP) else net.no_sync():
            loss = F.cross_entropy(net(x).reshape(-1, 256), y.reshape(-1))
            loss.backward()
        if diloco and communicate:
            diloco.average_gradients()  # warmup steps only
        if args.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        if avg and communicate:
            avg.before_step()
        opt.step()
        if args.slowdown and communicate and dist.get_rank() == args.slowdown[0]:  # a straggler: the step again, idle
            time.sleep((args.slowdown[1] - 1) * (time.perf_counter() - started))
        return loss

    def compute_only(n):
        """Forward, backward and the AdamW step without communication; the model and optimizer put back."""
        m, o, wrapped = (bare[0], bare[1], bare[0]) if bare else (model, opt, net)
        kept = copy.deepcopy((m.state_dict(), o.state_dict()))
        t0 = time.perf_counter()
        for i in range(n):
            train_step(*batch(i), communicate=False, net=wrapped, opt=o, model=m)
        took = (time.perf_counter() - t0) / n * 1e3
        with torch.no_grad():
            m.load_state_dict(kept[0])
        o.load_state_dict(kept[1])
        return took

    vx, vy = corpus.validation_windows(args.val_windows, args.context)

    @contextlib.contextmanager
    def scored_model():
        """The model evaluation scores: the ranks' mean under averaging and DiLoCo, the recipe's synced copy."""
        if avg or diloco or tft:
            with (avg or diloco or tft).mean_model():
                yield
        elif recipe:  # the ranks' mean model, as every other method's is scored (not the synced copy)
            own = [p.detach().clone() for p in model.parameters()]
            with torch.no_grad():
                for p in model.parameters():
                    dist.all_reduce(p.data)
                    p.data /= world
            yield
            with torch.no_grad():
                for p, o in zip(model.parameters(), own):
                    p.copy_(o)
        else:
            yield

    def validation_bpb():
        r, n = dist.get_rank(), dist.get_world_size()
        mine = slice(r * len(vx) // n, (r + 1) * len(vx) // n)
        with scored_model(), torch.no_grad():
            model.eval()
            loss = F.cross_entropy(model(vx[mine]).reshape(-1, 256), vy[mine].reshape(-1), reduction="sum")
            model.train()
        total = torch.tensor([loss.item(), float(vy[mine].numel())], dtype=torch.float64)
        dist.all_reduce(total)
        return total[0].item() / total[1].item() / math.log(2)

    def traced(step, seconds, bpb):
        if args.trace_file and dist.get_rank() == 0:
            with open(args.trace_file, "a") as f:
                f.write(f"{time.time():.3f} {step} {bpb:.6f}\n")
        return step, seconds, bpb

    compute_only(3)  # warms up
    compute_ms = compute_only(5)
    trace = [traced(0, 0.0, survive(validation_bpb))] if start == 0 and args.eval_every else []  # every row's start
    if not joined:  # the members are past their barrier
        survive(dist.barrier)
    before = hw.stats() if args.backend == "hopwise" else None
    averaged_before = avg.stats()["bytes"] if avg else 0
    wire_before, eval_wire = mlp.link_sent(), 0.0
    if tft:
        tft.__enter__()  # after compute_only: from here torchft syncs inside opt.step()
    t0 = time.perf_counter()
    loss_sum, losses, paused, eval_sent = 0.0, 0, 0.0, 0  # eval_sent: FSDP2's evaluation gathers too
    end = min(args.steps, start + args.stop_after) if args.stop_after else args.steps
    step = start
    while step < end:
        if ctx and survive(lambda: ctx.newcomers_waiting(step)):  # grow: the members agree at every 10th step
            def let_in():
                diloco.full_average()  # the newcomer starts from the synced model
                ctx.admit()
                return diloco.regroup()
            said = survive(let_in, again=False)
            if said and dist.get_rank() == 0:
                mlp.console_line_open(False)
                print(f"\ntrain.py: {said}", flush=True)
        loss = train_step(*batch(step))
        sched.step()
        if avg:
            avg.after_step()
        if diloco:
            survive(diloco.step, again=False)  # the step is counted; a broken sync is redone at the regroup
        if recipe:
            recipe.after_inner_step()
        if monitor:
            monitor.step()
        loss_sum, losses = loss_sum + loss.item(), losses + 1
        done = step + 1
        if ctx and diloco.steps > done:  # a regroup put this replica at the furthest one's step: its schedule too
            for _ in range(diloco.steps - done):
                sched.step()
            done = diloco.steps
        if ckpt and args.checkpoint_every and done % args.checkpoint_every == 0:
            save_checkpoint(done)
        if dist.get_rank() == 0 and (step % 10 == 0 or done == end):
            mlp.progress(done, args.steps, f"loss {loss_sum / losses:.3f} nats "
                         f"{(time.perf_counter() - t0 - paused) / (done - start) * 1e3:.0f} ms/step")
            loss_sum, losses = 0.0, 0
        if args.eval_every and (done % args.eval_every == 0) and done < args.steps:
            if avg or diloco:
                survive((avg or diloco).settle)  # a fragment in flight is waited for on the clock, as in training
            e0, s0, w0 = time.perf_counter(), hw.stats()["sent_bytes"] if before else 0, mlp.link_sent()
            trace.append(traced(done, e0 - t0 - paused, survive(validation_bpb)))
            paused += time.perf_counter() - e0
            eval_sent += hw.stats()["sent_bytes"] - s0 if before else 0
            eval_wire += mlp.link_sent() - w0 if w0 is not None else 0
        step = done
    if end < args.steps:  # cut short (--stop-after): the checkpoint holds the run
        dist.barrier()
        if lead:
            print(f"\ntrain.py: stopped after step {end} (--stop-after)")
        dist.destroy_process_group()
        return
    if avg or diloco:
        survive((avg or diloco).full_average)  # every rank the same model, as the final evaluation scores it
    if recipe and recipe.since:
        recipe.sync()  # the steps since the last sync
    if tft:
        tft.__exit__(None, None, None)  # steps past the last whole period stay unsynced: scored as the ranks' mean
    if monitor:
        monitor.finish()
    survive(dist.barrier)
    train_s = time.perf_counter() - t0 - paused
    after = hw.stats() if args.backend == "hopwise" else None
    wire = mlp.link_bytes_per_step(wire_before, eval_wire, args.steps - start)
    val_bpb = survive(validation_bpb)
    trace.append(traced(args.steps, train_s, val_bpb))
    lead, world = dist.get_rank() == 0, dist.get_world_size()  # under --elastic: who is here at the end
    ran = args.steps - start
    step_ms = train_s / max(1, ran) * 1e3
    sample = model.generate(b"def ", args.sample, seed=args.seed).decode("utf-8", "replace") if args.sample else ""
    if lead:
        mlp.console_line_open(False)
        print(f"\ntrain.py: {args.steps} steps in {train_s:.1f} s: step {step_ms:.0f} ms, compute {compute_ms:.0f} ms "
              f"(utilization {min(1.0, compute_ms / step_ms):.0%}), validation {val_bpb:.4f} bits per byte")
        if sample:
            print("train.py: the model writes, after 'def ':\n" + sample)
    per_step = params * 4
    if before is not None:
        per_step = (after["bytes"] - before["bytes"]) / max(1, ran)  # DDP and hooks: evaluation averages nothing
    if args.fsdp:  # what the transport sent (gloo's is not counted: the same collectives as uncompressed hopwise)
        per_step = (after["sent_bytes"] - before["sent_bytes"] - eval_sent) / max(1, ran) if before else None
    if avg:  # its own count: the backend's counts a codec's float32 buffer beside its payload
        per_step = (avg.stats()["bytes"] - averaged_before) / max(1, ran)
    if diloco:
        per_step = diloco.stats()["bytes"] / max(1, args.steps)
    if recipe:
        per_step = recipe.payload_bytes() * recipe.syncs / max(1, ran)
    if tft:  # torchft syncs every whole period (no resume under --torchft)
        per_step = tft.payload_bytes() * (ran // args.torchft) / max(1, ran)
    result = {
        "backend": args.backend, "method": method, "ranks": world, "parameters": params, "steps": args.steps,
        "tokens": args.steps * args.batch * args.context, "step_ms": step_ms, "compute_ms": compute_ms,
        "utilization": min(1.0, compute_ms / step_ms), "val_bpb": val_bpb, "val_trace": trace,
        "tokens_per_s": ran * args.batch * args.context / train_s, "bytes_per_step": per_step, "train_s": train_s,
        "link_bytes_per_step": wire,
        "resumed_at": start, "corpus": corpus.name, "diloco_stats": diloco.stats() if diloco else None,
        "sample": sample, "torchft_errored": tft.close() if tft else None, "fsdp": repr(comp) if comp else None,
    }
    if lead and args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
