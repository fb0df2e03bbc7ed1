// dlbatch-train: trains a job file's `train:` section, as `caffe train`
// does, on CPUs or GPUs; with --ranks N as N data-parallel processes. What
// it does is trainer/command.h's.
#include "trainer/command.h"

int main(int argc, char** argv) {
  return dlbatch::trainer::TrainCommand(argc, argv);
}
