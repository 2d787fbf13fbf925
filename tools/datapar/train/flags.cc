// datapar train's flags, as the command line gives them (add_train_command, see train.h);
// train_options.cc checks them.
#include <CLI/CLI.hpp>

#include "../cli_numbers.h"
#include "../commands.h"
#include "../train.h"

namespace datapar::tools {

CLI::App* add_train_command(CLI::App& app, TrainOptions& o) {
  auto* cmd = app.add_subcommand("train", kTrainSummary);
  // A flag given twice takes its last value, so scripts can append overrides.
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--model", o.model, "mlp, lenet or resnet18 (d2l's; default lenet)");
  cmd->add_option("--data", o.data,
                  "Fashion-MNIST IDX directory, or synthetic (default: the shipped 6000/1000 subset)");
  cmd->add_option("--epochs", o.epochs, "Epochs to train (default 10)")->check(whole_number<int64_t>());
  cmd->add_option("--batch-size", o.batch_size, "Global batch, split over devices or ranks (default 256)")
      ->check(whole_number<decltype(o.batch_size)>());
  cmd->add_option("--optimizer", o.optimizer,
                  "sgd (torch.optim.SGD, with --momentum; the default), adam or adamw (torch.optim.Adam, AdamW: "
                  "betas 0.9 and 0.999, eps 1e-8), in every mode");
  cmd->add_option("--amp", o.amp,
                  "Mixed precision, as torch.autocast: none (default), bf16 or fp16 (each step's forward computes "
                  "matmuls and convolutions in that type, losses and norms in float32; parameters, gradients and "
                  "the optimizer stay float32); fp16 with a gradient scaler, as torch.amp.GradScaler");
  cmd->add_flag("--cuda-graph", o.cuda_graph,
               "Capture each training step (forward, backward with DDP's all-reduces, SGD's update) into a CUDA "
               "graph once and replay it: one launch per step (--mode single or ddp on CUDA devices, SGD; the "
               "epoch's last partial batch is left out, a graph replays one shape)");
  cmd->add_option("--lr", o.lr, "Learning rate (default: 0.1 for sgd, as d2l; 1e-3 for adam and adamw, as torch.optim)");
  cmd->add_option("--momentum", o.momentum, "SGD momentum (default 0: plain SGD, as d2l)");
  cmd->add_option("--weight-decay", o.weight_decay,
                  "Weight decay, as torch.optim's weight_decay: sgd and adam add it x each parameter to the gradient "
                  "(L2), adamw shrinks the parameters by lr x it each step (decoupled). Default 0; adamw 0.01");
  cmd->add_option("--mode", o.mode,
                  "single, dp (DataParallel), ddp, fsdp (fully sharded: one rank per process, each keeping 1/N of "
                  "the parameters, gradients and optimizer state) or hsdp (hybrid: fsdp within each group of "
                  "--shard-size ranks, replicated across the groups; default single)");
  cmd->add_option("--devices", o.devices,
                  "single: one device (default cpu:0); dp: the replicas' devices (default every CUDA device, "
                  "else one CPU device per core); ddp: one per local rank (default cuda:LOCAL_RANK or CPU)");
  cmd->add_option("--backend", o.backend,
                  "ddp process group backend: gloo, nccl or mpi (default: nccl on CUDA devices, else mpi in a job "
                  "started by mpirun, else gloo)");
  cmd->add_option("--replicas", o.replicas,
                  "dp: shared (replicas on the model's device share its parameters; the default) or copy (every "
                  "replica but the first holds a copy, refreshed every forward, as on several GPUs)");
  cmd->add_flag("--scale-lr", o.scale_lr, "Linear scaling: N devices or ranks get N x batch and N x lr");
  cmd->add_option("--seed", o.seed, "Seed of the model's initialisation, the shuffling and synthetic data (default 0)")
      ->check(whole_number<decltype(o.seed)>());
  cmd->add_option("--checkpoint-dir", o.checkpoint_dir,
                  "Write a checkpoint after each epoch here (rank 0); created if missing");
  cmd->add_option("--checkpoint-format", o.checkpoint_format,
                  "torch: a torch.save file per epoch, written by rank 0 (the default); dcp: PyTorch's "
                  "torch.distributed.checkpoint, a directory epoch-N per epoch that every rank writes its share "
                  "of, loadable by Python's dcp.load at any world size")
      ->check(CLI::IsMember({"torch", "dcp"}));
  cmd->add_flag("--checkpoint-async", o.checkpoint_async,
                "Write the checkpoints in the background: the step that saves only copies the state into host "
                "memory (reused between saves), a thread writes it while training goes on; one write at a time, "
                "a failed write reported at the next step and at the end");
  cmd->add_flag("--resume", o.resume,
                "Continue from the newest intact checkpoint in --checkpoint-dir (damaged ones are reported and "
                "renamed *.damaged); an error if there is none");
  cmd->add_flag("--start-over", o.start_over,
                "With --resume or a restart: start from epoch 1 when --checkpoint-dir holds no intact checkpoint");
  cmd->add_flag("--evaluate", o.evaluate, "Only evaluate the latest checkpoint in --checkpoint-dir on the test set");
  cmd->add_option("--metrics", o.metrics, "Write per-epoch metrics here as JSON lines");
  cmd->add_option("--plot", o.plot, "Draw loss and accuracy per epoch into this PNG (needs gnuplot)");
  cmd->add_flag("--zero", o.zero,
                "ddp: shard the optimizer state over the ranks (ZeroRedundancyOptimizer, ZeRO-1): each rank keeps "
                "the momentum of its share of the parameters only; checkpoints hold the whole state. With "
                "--fault-tolerant each share is kept by two ranks, so that one failure loses none");
  cmd->add_flag("--fault-tolerant", o.fault_tolerant,
                "ddp, fsdp or hsdp under datapar launch --fault-tolerant: a rank that dies or hangs is left behind "
                "and the others go on from where they are (each step committed only when every live rank finished "
                "it); a restarted rank joins and takes the state from a peer. The global batches do not depend on "
                "who is alive, so the training does not either. Under fsdp (and --zero) each rank's shard is kept "
                "by the next rank too; under hsdp a shard group that loses a rank leaves the job as a whole until "
                "the rank is back, and takes its shards from another group's matching ranks");
  cmd->add_option("--sync-every", o.sync_every,
                  "ddp: local SGD or DiLoCo: each rank trains alone for N steps, then the ranks average their "
                  "models and take the outer step (and at each epoch's end); 0 (default): DDP, every step")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--outer-optimizer", o.outer_optimizer,
                  "--sync-every: nesterov (default, DiLoCo: SGD with Nesterov momentum on the difference the round "
                  "made) or replace (local SGD: the average is the new model)");
  cmd->add_option("--outer-lr", o.outer_lr, "--sync-every with nesterov: the outer learning rate (default 0.7)");
  cmd->add_option("--outer-momentum", o.outer_momentum, "--sync-every with nesterov: its momentum (default 0.9)");
  cmd->add_option("--fragments", o.fragments,
                  "--sync-every: Streaming DiLoCo: the model in K equal fragments, each synced every N steps at a "
                  "step of its own, so any one step sends 1/K of the model (default 1)");
  cmd->add_option("--outer-dtype", o.outer_dtype,
                  "--sync-every: what the averaging sends: float32 (default, the parameters exactly), bf16 or int8 "
                  "(the pseudo-gradients quantised: 2 or 1 bytes a value)");
  cmd->add_option("--comm-hook", o.comm_hook,
                  "ddp: how the gradients cross the network: allreduce (default), bf16 or fp16 (cast for the "
                  "all-reduce: half the bytes), or powersgd:RANK[:START] (PowerSGD, PyTorch's powerSGD_hook: each "
                  "layer's gradient sent as two rank-RANK matrices, with error feedback and warm start, after START "
                  "steps of plain all-reduce, default 1000)");
  cmd->add_flag("--reshard,!--no-reshard", o.reshard,
                "fsdp, hsdp: free each unit's gathered parameters after its forward and gather them again for backward "
                "(ZeRO-3, the default); --no-reshard keeps them until backward (less traffic, more memory)");
  cmd->add_option("--mp", o.mp,
                  "fsdp, hsdp: mixed precision: none (default), bf16 or fp16: parameters gathered and computed in that "
                  "dtype, gradients reduced in it, float32 shards stepped");
  cmd->add_option("--shard-size", o.shard_size,
                  "hsdp: ranks per shard group, consecutive ranks (default: a machine's, the launcher's local world "
                  "size); gathers and reduce-scatters stay within a group, one all-reduce of 1/N of the gradient "
                  "crosses groups")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--checkpoint-activations", o.checkpoint_activations,
                "resnet18: recompute each residual block's activations in backward instead of keeping them");
  cmd->add_option("--balance", o.balance,
                  "dp, ddp: even (the default: equal shares of each batch), auto (time every device or rank and "
                  "give each a share in proportion to its speed, re-measured as training goes), or fixed shares, one "
                  "per device or rank (e.g. 3,1). The gradient stays the whole batch's");
  cmd->add_option("--trace", o.trace,
                  "Write a timeline of every step here, all ranks in one file (Chrome trace JSON: open it in "
                  "Perfetto or chrome://tracing); rank 0 writes it at the end");
  cmd->add_option("--limit", o.limit, "Use only the first N train and N test samples (default 0: all)");
  cmd->add_option("--workers", o.workers, "Data loader threads per process (default 2)");
  cmd->add_option("--threads", o.threads, "Intra-op threads per process (default: cores / local ranks)");
  cmd->add_option("--slow-step", o.step_delay_ms,
                  "Make this process a straggler: each step sleeps this many milliseconds (to see the epoch "
                  "line name it; give it to one rank)")
      ->check(CLI::Range(0.0, 1e6));
  return cmd;
}

}  // namespace datapar::tools
