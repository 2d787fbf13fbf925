// plot_metrics: gnuplot in a child process (see plot.h).
//
// The data and the script go to a mkdtemp directory, which is removed afterwards, and
// gnuplot writes the PNG next to the target and we rename it into place, so a reader of
// the plot (a browser refreshing it during a long run) never sees half a PNG.
#include "datapar/train/plot.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "child_process.h"
#include "datapar/error.h"
#include "file_system.h"
#include "new_file.h"

namespace datapar::train {
namespace {

// gnuplot strings are in double quotes; escape what would end them.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string script(const std::string& data, const std::string& png, const std::string& title, bool cairo,
                   int64_t last_epoch) {
  std::ostringstream s;
  s << (cairo ? "set terminal pngcairo size 900,540 enhanced font \"sans,10\"\n" : "set terminal png size 900,540\n")
    << "set output " << quoted(png) << "\n"
    << "set title " << quoted(title) << " noenhanced\n"
    << "set xlabel \"epoch\"\n"
    << "set ylabel \"train loss\"\n"
    << "set y2label \"accuracy\"\n"
    << "set y2range [0:1]\n"
    << "set ytics nomirror\n"
    << "set y2tics 0.1\n"
    << "set xrange [" << (last_epoch > 1 ? 1 : 0.5) << ":" << (last_epoch > 1 ? last_epoch : 1.5) << "]\n"
    << "set xtics 1\n"
    << "set grid\n"
    << "set key bottom left box opaque\n"
    << "plot " << quoted(data) << " using 1:2 axes x1y1 with linespoints lw 2 pt 7 title \"train loss\", \\\n"
    << "     '' using 1:3 axes x1y2 with linespoints lw 2 pt 5 title \"train acc\", \\\n"
    << "     '' using 1:4 axes x1y2 with linespoints lw 2 pt 9 title \"test acc\"\n";
  return s.str();
}

// Runs `gnuplot script_path` with stdout and stderr to `log_path`; returns its exit status.
int run_gnuplot(const std::string& gnuplot, const std::string& script_path, const std::string& log_path) {
  const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DATAPAR_CHECK(log >= 0, "plot: cannot write ", log_path, " (", std::strerror(errno), ")");
  detail::ChildOptions options;
  options.stdout_fd = log;
  options.stderr_fd = log;
  options.who = "datapar plot";
  const pid_t pid = detail::start_child({gnuplot, script_path}, options);
  const int error = errno;
  ::close(log);
  DATAPAR_CHECK(pid > 0, "plot: cannot start ", gnuplot, " (", std::strerror(error), ")");
  const detail::ChildExit exit = detail::wait_child(pid);
  return exit.exit_code >= 0 ? exit.exit_code : 128;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::string find_gnuplot() { return detail::find_executable("gnuplot"); }

void plot_metrics(const std::vector<EpochMetrics>& history, const std::string& png_path, const std::string& title) {
  const std::string gnuplot = find_gnuplot();
  DATAPAR_CHECK(!gnuplot.empty(), "--plot ", png_path,
                ": gnuplot is not installed (not on PATH).\n---> HINT: apt-get install gnuplot-nox, or leave out --plot.");
  DATAPAR_CHECK(!history.empty(), "--plot ", png_path, ": no epochs to plot.");

  char tmpl[] = "/tmp/datapar-plot-XXXXXX";
  DATAPAR_CHECK(::mkdtemp(tmpl) != nullptr, "plot: cannot make a temporary directory in /tmp");
  const std::string dir = tmpl;
  const std::string data = dir + "/metrics.dat", gp = dir + "/plot.gp", log = dir + "/gnuplot.log";
  {
    std::ofstream out(data);
    out << "# epoch train_loss train_accuracy test_accuracy\n";
    for (const EpochMetrics& m : history) {
      out << m.epoch << " " << m.train_loss << " " << m.train_accuracy << " " << m.test_accuracy << "\n";
    }
  }
  // gnuplot writes a name made for it here, exclusively and unguessable (Note [Creating a
  // file]), which then replaces the plot.
  const detail::TemporaryFile made = detail::create_temporary_beside(png_path, 0644);
  if (made.fd < 0) {
    detail::remove_tree(dir);
    throw Error("--plot " + png_path + ": cannot create a temporary file beside it (" + made.error + ").");
  }
  ::close(made.fd);
  const std::string tmp_png = made.path;
  int code = 1;
  std::string output;
  // pngcairo looks better; a gnuplot built without cairo has only png.
  for (bool cairo : {true, false}) {
    std::ofstream(gp) << script(data, tmp_png, title, cairo, history.back().epoch);
    code = run_gnuplot(gnuplot, gp, log);
    output = read_all(log);
    if (code == 0) break;
  }
  detail::remove_tree(dir);
  if (code != 0) {
    ::unlink(tmp_png.c_str());
    throw Error("--plot " + png_path + ": gnuplot failed (exit " + std::to_string(code) + "): " + output);
  }
  DATAPAR_CHECK(::rename(tmp_png.c_str(), png_path.c_str()) == 0, "--plot ", png_path, ": cannot move ", tmp_png,
                " into place: ", std::strerror(errno), ".");
}

}  // namespace datapar::train
