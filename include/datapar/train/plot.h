// A PNG plot of a training run: training loss, train accuracy and test accuracy per epoch,
// drawn by gnuplot (Debian's gnuplot-nox). datapar draws nothing itself: it writes the
// data and a gnuplot script to a temporary directory and runs gnuplot on them, so the
// picture comes from a real plotting tool and the script can be read when it goes wrong.
#pragma once

#include <string>
#include <vector>

#include "datapar/train/metrics.h"

namespace datapar::train {

// The gnuplot executable found on PATH, or "" when there is none.
std::string find_gnuplot();

// Writes a PNG of `history` (one entry per epoch, in order) to `png_path`: loss on the left
// axis, accuracies (0..1) on the right, epochs along x. `title` heads the plot. Uses the
// pngcairo terminal, or png where gnuplot lacks cairo. Blocks until gnuplot exits; the
// file is replaced atomically (written next to it, then renamed). Throws
// InvalidArgumentError when gnuplot is missing (saying to install gnuplot-nox) and Error
// when it fails (with its output).
void plot_metrics(const std::vector<EpochMetrics>& history, const std::string& png_path, const std::string& title);

}  // namespace datapar::train
