// Binary file I/O shared by the emulator harnesses (*_main.cpp): arrays go in and out as raw
// little-endian files written by the Python tests.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

// The file as T values plus `pad` zeros; empty when it does not exist (optional inputs such as a bias).
template <class T>
static std::vector<T> read_file(const std::string& path, size_t pad = 0) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return {};
    fseek(f, 0, SEEK_END);
    const long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    std::vector<T> v(bytes / sizeof(T) + pad);
    if (fread(v.data(), 1, bytes, f) != (size_t)bytes) exit(3);
    fclose(f);
    return v;
}

// The same for an input that must exist: exit status 3 when it does not.
template <class T>
static std::vector<T> read_required(const std::string& path) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) exit(3);
    fclose(f);
    return read_file<T>(path);
}

template <class T>
static void write_file(const std::string& path, const std::vector<T>& v) {
    FILE* o = fopen(path.c_str(), "wb");
    fwrite(v.data(), sizeof(T), v.size(), o);
    fclose(o);
}
