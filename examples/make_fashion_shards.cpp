// Converts the Fashion-MNIST IDX files into WebDataset tar shards of JPEG images:
//   ./make_fashion_shards [--data DIR] [--out DIR] [--split train|t10k] [--samples-per-shard N] [--max N]
// Sample i of the split becomes <out>/<split>-00000k.tar members "<i>.jpg" (28x28 grey, quality 95)
// and "<i>.cls" (the label as text), with <out>/index.json beside them, ready for
// cohort::shard_dataset (examples/fashion_mnist_shards.cpp) and for Python's webdataset.

#include <cohort/data/idx.hpp>
#include <cohort/data/jpeg.hpp>
#include <cohort/data/shard_writer.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <span>
#include <string>

int main(int argc, char** argv) {
  char const* env = std::getenv("FASHION_MNIST_DIR");  // a copy elsewhere; --data says otherwise
  std::string data = env && *env ? env : "/usr/share/datasets/fashion-mnist", out = "fashion_shards", split = "train";
  std::size_t per_shard = 2000, max = 0;
  for (int i = 1; i < argc; i += 2) {
    std::string const flag = argv[i];
    std::string const value = i + 1 < argc ? argv[i + 1] : "";
    try {
      if (value.empty()) throw std::invalid_argument("no value");
      if (flag == "--data") data = value;
      else if (flag == "--out") out = value;
      else if (flag == "--split") split = value;
      else if (flag == "--samples-per-shard") per_shard = std::stoul(value);
      else if (flag == "--max") max = std::stoul(value);
      else throw std::invalid_argument("unknown");
    } catch (std::exception const&) {
      std::cerr << "bad flag " << flag << " (or its value): use --data DIR, --out DIR, --split train|t10k, "
                   "--samples-per-shard N or --max N\n";
      return 2;
    }
  }
  try {
    auto images = cohort::data::read_idx(std::filesystem::path(data) / (split + "-images-idx3-ubyte.gz"));
    auto labels = cohort::data::read_idx(std::filesystem::path(data) / (split + "-labels-idx1-ubyte.gz"));
    if (images.dims.size() != 3 || labels.dims.size() != 1 || images.dims[0] != labels.dims[0])
      throw cohort::error("Fashion-MNIST files in " + data + " do not match (" + split + "): expected N x 28 x 28 images and N labels");
    auto const n = max > 0 ? std::min<std::size_t>(max, images.dims[0]) : static_cast<std::size_t>(images.dims[0]);
    auto const pixels = static_cast<std::size_t>(images.dims[1] * images.dims[2]);
    cohort::data::shard_writer writer(out, {.prefix = split, .samples_per_shard = per_shard});
    for (std::size_t i = 0; i < n; ++i) {
      auto jpg = cohort::data::encode_jpeg(std::span(images.data.data() + i * pixels, pixels),
                                           {static_cast<int>(images.dims[2]), static_cast<int>(images.dims[1]), 1}, 95);
      auto cls = std::to_string(labels.data[i]);
      char key[24];
      std::snprintf(key, sizeof key, "%06zu", i);
      writer.write(key, {{"jpg", jpg}, {"cls", std::as_bytes(std::span(cls.data(), cls.size()))}});
    }
    auto shards = writer.close();
    std::cout << "wrote " << n << " samples in " << shards.shards.size() << " shards to " << out << "\n";
  } catch (cohort::error const& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
