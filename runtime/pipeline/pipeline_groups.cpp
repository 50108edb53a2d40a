// The pipeline's groups on a rank grid (pipeline_parallel.h, make_pipeline_groups): both come
// from a DeviceMesh, the one place that makes process groups.
#include <tandem/runtime/pipeline_parallel.h>

#include <tandem/base/errors.h>
#include <tandem/collectives/device_mesh.h>

#include <string>
#include <vector>

namespace tandem {

PipelineGroups make_pipeline_groups(Communicator& world, int pipeline_size) {
  if (pipeline_size < 1 || world.size() % pipeline_size != 0) {
    throw ConfigError("pipeline size " + std::to_string(pipeline_size) +
                      " must divide the world size " + std::to_string(world.size()));
  }
  // Consecutive ranks form one pipeline: pp is the mesh's fastest dimension. A lane of their own
  // makes both groups fresh communicators, never the borrowed world.
  DeviceMesh mesh(std::shared_ptr<Communicator>(&world, [](Communicator*) {}),
                  {{"dp", world.size() / pipeline_size}, {"pp", pipeline_size}});
  PipelineGroups g;
  g.pipeline = mesh.group({"pp"}, "pipeline");
  if (world.size() > pipeline_size) g.data = mesh.group({"dp"}, "pipeline");
  return g;
}

PipelineGroups make_pipeline_groups(DeviceMesh& mesh) {
  std::vector<std::string> data;
  int data_ranks = 1;
  for (const MeshDim& d : mesh.dims()) {
    if (d.name == "pp") continue;
    data.push_back(d.name);
    data_ranks *= d.size;
  }
  PipelineGroups g;
  g.pipeline = mesh.group({"pp"});
  if (data_ranks > 1) g.data = mesh.group(data);
  return g;
}

}  // namespace tandem
