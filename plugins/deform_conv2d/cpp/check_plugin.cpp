// CPU-side checks of the DeformConv2d plugin library: dlopen()s it, takes the creator from getCreators() and
// exercises the creator and plugin interfaces without a GPU, without libnvinfer and without launching a kernel.
// The executable exports a stand-in getPluginRegistry(), so the library's load-time registration is checked too.
//
// Usage: check_deform_conv2d_plugin <libgskit_deform_conv2d.so> <spec.txt>
//
// spec.txt is written from plugins/deform_conv2d/spec.py by test_cpp_plugin.py, so that the library is checked
// against the spec and not against a second copy of it:
//   name DeformConv2d | namespace gskit | version 1 | inputs <min> <max>
//   attr <name> <int|ints> <default values...>                     (one line per attribute, in spec order)
//   shape <attr>=<v,v..>... x=<dims> weight=<dims> y=<dims>        (y from SPEC.infer for that x and weight)
// Prints one line per check and "N checks passed, M failed"; exits 1 when a check failed, 2 on a usage error.
#include "NvInferRuntime.h"

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

using namespace nvinfer1;

namespace
{
int gPassed = 0;
int gFailed = 0;

void check(bool ok, std::string const& what)
{
    (ok ? gPassed : gFailed) += 1;
    std::cout << (ok ? "[ok]   " : "[FAIL] ") << what << "\n";
}

// ---- spec.txt -------------------------------------------------------------------------------------------

struct SpecAttribute
{
    std::string name;
    std::string type; // "int" or "ints"
    std::vector<int32_t> defaults;
};

struct ShapeCase
{
    std::map<std::string, std::vector<int32_t>> attrs;
    std::vector<int64_t> x, weight, y;
};

struct Spec
{
    std::string name, nameSpace, version;
    int32_t minInputs{0}, maxInputs{0};
    std::vector<SpecAttribute> attributes;
    std::vector<ShapeCase> shapes;
};

template <typename T>
std::vector<T> parseList(std::string const& text)
{
    std::vector<T> values;
    std::stringstream stream(text);
    std::string item;
    while (std::getline(stream, item, ','))
    {
        values.push_back(static_cast<T>(std::stoll(item)));
    }
    return values;
}

Spec readSpec(std::string const& path)
{
    std::ifstream file(path);
    if (!file)
    {
        throw std::runtime_error("cannot read " + path);
    }
    Spec spec;
    std::string line;
    while (std::getline(file, line))
    {
        std::stringstream words(line);
        std::string key;
        if (!(words >> key))
        {
            continue;
        }
        if (key == "name")
        {
            words >> spec.name;
        }
        else if (key == "namespace")
        {
            words >> spec.nameSpace;
        }
        else if (key == "version")
        {
            words >> spec.version;
        }
        else if (key == "inputs")
        {
            words >> spec.minInputs >> spec.maxInputs;
        }
        else if (key == "attr")
        {
            SpecAttribute attribute;
            words >> attribute.name >> attribute.type;
            int32_t value = 0;
            while (words >> value)
            {
                attribute.defaults.push_back(value);
            }
            spec.attributes.push_back(attribute);
        }
        else if (key == "shape")
        {
            ShapeCase shape;
            std::string token;
            while (words >> token)
            {
                auto const eq = token.find('=');
                std::string const k = token.substr(0, eq);
                std::string const v = token.substr(eq + 1);
                if (k == "x")
                {
                    shape.x = parseList<int64_t>(v);
                }
                else if (k == "weight")
                {
                    shape.weight = parseList<int64_t>(v);
                }
                else if (k == "y")
                {
                    shape.y = parseList<int64_t>(v);
                }
                else
                {
                    shape.attrs[k] = parseList<int32_t>(v);
                }
            }
            spec.shapes.push_back(shape);
        }
        else
        {
            throw std::runtime_error(path + ": unknown line '" + line + "'");
        }
    }
    return spec;
}

// ---- fakes for what TensorRT would pass -------------------------------------------------------------------

class CaptureLogger : public ILogger
{
public:
    void log(Severity severity, AsciiChar const* msg) noexcept override
    {
        if (severity <= Severity::kERROR)
        {
            errors.emplace_back(msg);
        }
    }
    std::vector<std::string> errors;
};

class Finder : public ILoggerFinder
{
public:
    explicit Finder(ILogger* logger)
        : mLogger(logger)
    {
    }
    ILogger* findLogger() override
    {
        return mLogger;
    }

private:
    ILogger* mLogger;
};

//! An IDimensionExpr that is either a known constant or an unknown (run-time) value.
class FakeDimImpl : public apiv::VDimensionExpr
{
public:
    FakeDimImpl(bool constant, int64_t value)
        : mConstant(constant)
        , mValue(value)
    {
    }
    bool isConstant() const override
    {
        return mConstant;
    }
    int64_t getConstantValue() const override
    {
        return mConstant ? mValue : std::numeric_limits<int64_t>::min();
    }
    bool isSizeTensor() const override
    {
        return false;
    }

private:
    bool mConstant;
    int64_t mValue;
};

class FakeDim : public IDimensionExpr
{
public:
    FakeDim(bool constant, int64_t value)
        : mStore(constant, value)
    {
        mImpl = &mStore;
    }
    ~FakeDim() noexcept override = default;

private:
    FakeDimImpl mStore;
};

int64_t floorDiv(int64_t a, int64_t b)
{
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

//! Evaluates DimensionOperation on constants; anything involving an unknown value is unknown.
class FakeBuilderImpl : public apiv::VExprBuilder
{
public:
    IDimensionExpr const* constant(int64_t value) override
    {
        return make(true, value);
    }
    IDimensionExpr const* operation(
        DimensionOperation op, IDimensionExpr const& first, IDimensionExpr const& second) override
    {
        if (!first.isConstant() || !second.isConstant())
        {
            return make(false, 0);
        }
        int64_t const a = first.getConstantValue();
        int64_t const b = second.getConstantValue();
        switch (op)
        {
        case DimensionOperation::kSUM: return make(true, a + b);
        case DimensionOperation::kPROD: return make(true, a * b);
        case DimensionOperation::kMAX: return make(true, a > b ? a : b);
        case DimensionOperation::kMIN: return make(true, a < b ? a : b);
        case DimensionOperation::kSUB: return make(true, a - b);
        case DimensionOperation::kEQUAL: return make(true, a == b ? 1 : 0);
        case DimensionOperation::kLESS: return make(true, a < b ? 1 : 0);
        case DimensionOperation::kFLOOR_DIV: return b == 0 ? nullptr : make(true, floorDiv(a, b));
        case DimensionOperation::kCEIL_DIV: return b == 0 ? nullptr : make(true, -floorDiv(-a, b));
        }
        return nullptr;
    }
    IDimensionExpr const* declareSizeTensor(int32_t, IDimensionExpr const&, IDimensionExpr const&) override
    {
        return make(false, 0);
    }
    IDimensionExpr const* make(bool constant, int64_t value)
    {
        mDims.push_back(std::make_unique<FakeDim>(constant, value));
        return mDims.back().get();
    }

private:
    std::deque<std::unique_ptr<FakeDim>> mDims;
};

class FakeBuilder : public IExprBuilder
{
public:
    FakeBuilder()
    {
        mImpl = &store;
    }
    ~FakeBuilder() noexcept override = default;
    FakeBuilderImpl store;
};

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" // the IPluginCreator (V2) overloads must be overridden
//! Stands in for libnvinfer's global plugin registry and records what the library registers with it.
class FakeRegistry : public IPluginRegistry
{
public:
    bool registerCreator(IPluginCreator&, AsciiChar const* const) noexcept override
    {
        return false;
    }
    IPluginCreator* const* getPluginCreatorList(int32_t* const numCreators) const noexcept override
    {
        *numCreators = 0;
        return nullptr;
    }
    IPluginCreator* getPluginCreator(AsciiChar const* const, AsciiChar const* const, AsciiChar const* const) noexcept
        override
    {
        return nullptr;
    }
    void setErrorRecorder(IErrorRecorder* const) noexcept override {}
    IErrorRecorder* getErrorRecorder() const noexcept override
    {
        return nullptr;
    }
    bool deregisterCreator(IPluginCreator const&) noexcept override
    {
        return false;
    }
    bool isParentSearchEnabled() const override
    {
        return true;
    }
    void setParentSearchEnabled(bool const) override {}
    PluginLibraryHandle loadLibrary(AsciiChar const*) noexcept override
    {
        return nullptr;
    }
    void deregisterLibrary(PluginLibraryHandle) noexcept override {}
    bool registerCreator(IPluginCreatorInterface& creator, AsciiChar const* const pluginNamespace) noexcept override
    {
        registered.push_back(&creator);
        namespaces.emplace_back(pluginNamespace != nullptr ? pluginNamespace : "(null)");
        return true;
    }
    IPluginCreatorInterface* const* getAllCreators(int32_t* const numCreators) const noexcept override
    {
        *numCreators = static_cast<int32_t>(registered.size());
        return registered.data();
    }
    IPluginCreatorInterface* getCreator(AsciiChar const* const, AsciiChar const* const, AsciiChar const* const) noexcept
        override
    {
        return nullptr;
    }
    bool deregisterCreator(IPluginCreatorInterface const& creator) noexcept override
    {
        deregistered.push_back(&creator);
        return true;
    }
    IPluginResource* acquirePluginResource(AsciiChar const*, IPluginResource*) noexcept override
    {
        return nullptr;
    }
    int32_t releasePluginResource(AsciiChar const*) noexcept override
    {
        return 0;
    }

    std::vector<IPluginCreatorInterface*> registered;
    std::vector<std::string> namespaces;
    std::vector<IPluginCreatorInterface const*> deregistered;
};
#pragma GCC diagnostic pop

FakeRegistry gRegistry;

class FakeResourceContext : public IPluginResourceContext
{
public:
    IGpuAllocator* getGpuAllocator() const noexcept override
    {
        return nullptr;
    }
    IErrorRecorder* getErrorRecorder() const noexcept override
    {
        return nullptr;
    }
};

// ---- helpers ----------------------------------------------------------------------------------------------

Dims makeDims(std::vector<int64_t> const& values)
{
    Dims dims{};
    dims.nbDims = static_cast<int32_t>(values.size());
    for (size_t i = 0; i < values.size(); ++i)
    {
        dims.d[i] = values[i];
    }
    return dims;
}

std::string join(std::vector<int64_t> const& values)
{
    std::string text;
    for (size_t i = 0; i < values.size(); ++i)
    {
        text += (i > 0 ? "," : "") + std::to_string(values[i]);
    }
    return text;
}

//! Fields as the ONNX parser passes them (INT and INTS -> kINT32), owning their data.
class Fields
{
public:
    Fields& set(std::string const& name, std::vector<int32_t> values, PluginFieldType type = PluginFieldType::kINT32)
    {
        mNames.push_back(name);
        mValues.push_back(std::move(values));
        mTypes.push_back(type);
        return *this;
    }
    Fields& setInt64(std::string const& name, std::vector<int64_t> values)
    {
        mNames.push_back(name);
        mValues.emplace_back();
        mTypes.push_back(PluginFieldType::kINT64);
        mInt64[mNames.size() - 1] = std::move(values);
        return *this;
    }
    PluginFieldCollection const* collection()
    {
        mFields.clear();
        for (size_t i = 0; i < mNames.size(); ++i)
        {
            auto const wide = mInt64.find(i);
            void const* data = wide != mInt64.end() ? static_cast<void const*>(wide->second.data())
                                                    : static_cast<void const*>(mValues[i].data());
            int32_t const length = static_cast<int32_t>(
                wide != mInt64.end() ? wide->second.size() : mValues[i].size());
            mFields.emplace_back(mNames[i].c_str(), length == 0 ? nullptr : data, mTypes[i], length);
        }
        mCollection.nbFields = static_cast<int32_t>(mFields.size());
        mCollection.fields = mFields.data();
        return &mCollection;
    }

private:
    std::deque<std::string> mNames;
    std::deque<std::vector<int32_t>> mValues;
    std::vector<PluginFieldType> mTypes;
    std::map<size_t, std::vector<int64_t>> mInt64;
    std::vector<PluginField> mFields;
    PluginFieldCollection mCollection{};
};

using Values = std::map<std::string, std::vector<int32_t>>;

//! The serialized fields of a plugin as name -> int32 values; empty when a field is not INT32.
Values serialized(IPluginV3* plugin)
{
    Values values;
    auto* runtime = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    PluginFieldCollection const* fc = runtime->getFieldsToSerialize();
    for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i)
    {
        PluginField const& f = fc->fields[i];
        std::vector<int32_t> v;
        if (f.type == PluginFieldType::kINT32 && f.data != nullptr)
        {
            auto const* data = static_cast<int32_t const*>(f.data);
            v.assign(data, data + f.length);
        }
        values[f.name] = v;
    }
    return values;
}

std::string show(Values const& values)
{
    std::string text;
    for (auto const& [name, v] : values)
    {
        text += " " + name + "=";
        for (size_t i = 0; i < v.size(); ++i)
        {
            text += (i > 0 ? "," : "") + std::to_string(v[i]);
        }
    }
    return text;
}

Fields fieldsOf(Values const& values)
{
    Fields fields;
    for (auto const& [name, v] : values)
    {
        fields.set(name, v);
    }
    return fields;
}

struct PluginDeleter
{
    void operator()(IPluginV3* plugin) const
    {
        delete plugin;
    }
};
using PluginPtr = std::unique_ptr<IPluginV3, PluginDeleter>;

IPluginV3OneBuild* build(IPluginV3* plugin)
{
    return static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
}

IPluginV3OneRuntime* runtime(IPluginV3* plugin)
{
    return static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
}

// ---- checks -----------------------------------------------------------------------------------------------

void checkCreator(IPluginCreatorV3One* creator, Spec const& spec)
{
    InterfaceInfo const info = creator->getInterfaceInfo();
    check(std::string{info.kind} == "PLUGIN CREATOR_V3ONE" && info.major == 1,
        "creator is an IPluginCreatorV3One (interface '" + std::string{info.kind} + "')");
    check(std::string{creator->getPluginName()} == spec.name, "creator name '" + std::string{creator->getPluginName()}
        + "' == spec '" + spec.name + "'");
    check(std::string{creator->getPluginVersion()} == spec.version,
        "creator version '" + std::string{creator->getPluginVersion()} + "' == spec '" + spec.version + "'");
    check(std::string{creator->getPluginNamespace()} == spec.nameSpace,
        "creator namespace '" + std::string{creator->getPluginNamespace()} + "' == spec '" + spec.nameSpace + "'");

    PluginFieldCollection const* fields = creator->getFieldNames();
    check(fields != nullptr && fields->nbFields == static_cast<int32_t>(spec.attributes.size()),
        "creator has one field per spec attribute (" + std::to_string(spec.attributes.size()) + ")");
    size_t const nbFields = fields != nullptr ? static_cast<size_t>(fields->nbFields) : 0;
    for (size_t i = 0; i < spec.attributes.size() && i < nbFields; ++i)
    {
        SpecAttribute const& attribute = spec.attributes[i];
        PluginField const& field = fields->fields[i];
        int32_t const length = attribute.type == "int" ? 1 : static_cast<int32_t>(attribute.defaults.size());
        check(field.name != nullptr && attribute.name == field.name && field.type == PluginFieldType::kINT32
                && field.length == length,
            "field " + std::to_string(i) + " is '" + attribute.name + "' INT32 x" + std::to_string(length)
                + " (the ONNX parser passes INT/INTS as INT32)");
    }
}

void checkPlugin(IPluginV3* plugin, Spec const& spec, std::string const& label)
{
    InterfaceInfo const info = plugin->getInterfaceInfo();
    check(std::string{info.kind} == "PLUGIN" && info.major == 1, label + ": is an IPluginV3");
    auto* core = static_cast<IPluginV3OneCore*>(plugin->getCapabilityInterface(PluginCapabilityType::kCORE));
    check(core != nullptr && std::string{core->getInterfaceInfo().kind} == "PLUGIN_V3ONE_CORE",
        label + ": kCORE capability is IPluginV3OneCore");
    check(build(plugin) != nullptr && std::string{build(plugin)->getInterfaceInfo().kind} == "PLUGIN_V3ONE_BUILD",
        label + ": kBUILD capability is IPluginV3OneBuild");
    check(runtime(plugin) != nullptr
            && std::string{runtime(plugin)->getInterfaceInfo().kind} == "PLUGIN_V3ONE_RUNTIME",
        label + ": kRUNTIME capability is IPluginV3OneRuntime");
    check(core != nullptr && spec.name == core->getPluginName() && spec.version == core->getPluginVersion()
            && spec.nameSpace == core->getPluginNamespace(),
        label + ": plugin name/version/namespace match the creator's");
}

void checkFormats(IPluginV3OneBuild* plugin, int32_t nbInputs)
{
    std::string const n = std::to_string(nbInputs) + " inputs";
    int32_t const total = nbInputs + 1;
    auto descs = [&](DataType type, TensorFormat format) {
        std::vector<DynamicPluginTensorDesc> d(total);
        for (auto& desc : d)
        {
            desc.desc.type = type;
            desc.desc.format = format;
            desc.desc.dims = makeDims({-1, -1, -1, -1});
        }
        return d;
    };
    for (DataType type : {DataType::kFLOAT, DataType::kHALF})
    {
        auto d = descs(type, TensorFormat::kLINEAR);
        bool all = true;
        for (int32_t pos = 0; pos < total; ++pos)
        {
            all = all && plugin->supportsFormatCombination(pos, d.data(), nbInputs, 1);
        }
        check(all, n + ": all " + (type == DataType::kFLOAT ? "float32" : "float16") + " linear is supported");
    }
    for (DataType type : {DataType::kINT8, DataType::kINT32, DataType::kBF16, DataType::kINT64})
    {
        auto d = descs(type, TensorFormat::kLINEAR);
        check(!plugin->supportsFormatCombination(0, d.data(), nbInputs, 1),
            n + ": x of DataType " + std::to_string(static_cast<int32_t>(type)) + " is rejected");
    }
    for (int32_t pos = 1; pos < total; ++pos)
    {
        auto d = descs(DataType::kFLOAT, TensorFormat::kLINEAR);
        d[pos].desc.type = DataType::kHALF;
        bool mixedFloatHalf = plugin->supportsFormatCombination(pos, d.data(), nbInputs, 1);
        d = descs(DataType::kHALF, TensorFormat::kLINEAR);
        d[pos].desc.type = DataType::kFLOAT;
        bool mixedHalfFloat = plugin->supportsFormatCombination(pos, d.data(), nbInputs, 1);
        check(!mixedFloatHalf && !mixedHalfFloat, n + ": mixed float32/float16 at position " + std::to_string(pos)
            + " is rejected");
    }
    for (TensorFormat format : {TensorFormat::kCHW32, TensorFormat::kHWC8, TensorFormat::kCHW2, TensorFormat::kHWC})
    {
        auto d = descs(DataType::kHALF, format);
        bool any = false;
        for (int32_t pos = 0; pos < total; ++pos)
        {
            any = any || plugin->supportsFormatCombination(pos, d.data(), nbInputs, 1);
        }
        check(!any, n + ": TensorFormat " + std::to_string(static_cast<int32_t>(format)) + " is rejected");
    }
    auto d = descs(DataType::kFLOAT, TensorFormat::kLINEAR);
    check(!plugin->supportsFormatCombination(total, d.data(), nbInputs, 1)
            && !plugin->supportsFormatCombination(-1, d.data(), nbInputs, 1),
        n + ": a position out of range is rejected");
}

void checkTypes(IPluginV3OneBuild* plugin)
{
    for (int32_t nbInputs = 3; nbInputs <= 5; ++nbInputs)
    {
        for (DataType type : {DataType::kFLOAT, DataType::kHALF})
        {
            std::vector<DataType> in(nbInputs, type);
            DataType out = DataType::kINT8;
            int32_t const status = plugin->getOutputDataTypes(&out, 1, in.data(), nbInputs);
            check(status == 0 && out == type, std::to_string(nbInputs) + " inputs: getOutputDataTypes gives x's type ("
                + (type == DataType::kFLOAT ? "float32" : "float16") + ")");
        }
    }
    std::vector<DataType> in(3, DataType::kFLOAT);
    DataType out[2];
    check(plugin->getOutputDataTypes(out, 2, in.data(), 3) != 0, "getOutputDataTypes rejects 2 outputs");
    check(plugin->getOutputDataTypes(out, 1, in.data(), 2) != 0, "getOutputDataTypes rejects 2 inputs");
}

void checkShapes(IPluginV3OneBuild* plugin, ShapeCase const& shape, std::string const& label)
{
    FakeBuilder builder;
    IDimensionExpr const* batch = builder.store.make(false, 0); // N unknown until run time
    auto exprs = [&](std::vector<int64_t> const& dims, bool symbolicBatch) {
        DimsExprs e{};
        e.nbDims = static_cast<int32_t>(dims.size());
        for (size_t i = 0; i < dims.size(); ++i)
        {
            e.d[i] = (i == 0 && symbolicBatch) ? batch : builder.store.make(true, dims[i]);
        }
        return e;
    };
    DimsExprs inputs[3] = {exprs(shape.x, true), exprs(shape.weight, false), exprs({1, 1, 1, 1}, true)};
    DimsExprs output{};
    int32_t const status = plugin->getOutputShapes(inputs, 3, nullptr, 0, &output, 1, builder);
    bool ok = status == 0 && output.nbDims == 4 && output.d[0] == batch;
    std::vector<int64_t> got{-1};
    for (int32_t i = 1; ok && i < 4; ++i)
    {
        ok = output.d[i] != nullptr && output.d[i]->isConstant();
        got.push_back(ok ? output.d[i]->getConstantValue() : -1);
    }
    ok = ok && got[1] == shape.y[1] && got[2] == shape.y[2] && got[3] == shape.y[3];
    check(ok, label + ": getOutputShapes x=" + join(shape.x) + " weight=" + join(shape.weight) + " -> (N," + join(
        std::vector<int64_t>(got.begin() + 1, got.end())) + "), spec.infer says (N," + join(std::vector<int64_t>(
        shape.y.begin() + 1, shape.y.end())) + ")");

    // H unknown: the spatial size is an expression, not a failure.
    DimsExprs dynamic[3] = {exprs(shape.x, true), exprs(shape.weight, false), exprs({1, 1, 1, 1}, true)};
    dynamic[0].d[2] = builder.store.make(false, 0);
    check(plugin->getOutputShapes(dynamic, 3, nullptr, 0, &output, 1, builder) == 0 && !output.d[2]->isConstant()
            && output.d[3]->isConstant(),
        label + ": getOutputShapes with an unknown H gives an unknown oH");
}

//! The default-attribute example shapes: x (1,4,6,7), weight (4,4,3,3), offset (1,18,4,5), bias (4,),
//! mask (1,9,4,5), y (1,4,4,5).
std::vector<std::vector<int64_t>> exampleShapes()
{
    return {{1, 4, 6, 7}, {4, 4, 3, 3}, {1, 18, 4, 5}, {4}, {1, 9, 4, 5}, {1, 4, 4, 5}};
}

int32_t configure(IPluginV3OneBuild* plugin, std::vector<std::vector<int64_t>> const& shapes, int32_t nbInputs)
{
    std::vector<DynamicPluginTensorDesc> in(nbInputs);
    for (int32_t i = 0; i < nbInputs; ++i)
    {
        in[i].desc.dims = makeDims(shapes[i]);
        in[i].desc.type = DataType::kFLOAT;
        in[i].desc.format = TensorFormat::kLINEAR;
        in[i].min = in[i].opt = in[i].max = in[i].desc.dims;
    }
    DynamicPluginTensorDesc out{};
    out.desc.dims = makeDims(shapes[5]);
    out.desc.type = DataType::kFLOAT;
    out.desc.format = TensorFormat::kLINEAR;
    return plugin->configurePlugin(in.data(), nbInputs, &out, 1);
}

int32_t shapeChange(IPluginV3OneRuntime* plugin, std::vector<std::vector<int64_t>> const& shapes, int32_t nbInputs)
{
    std::vector<PluginTensorDesc> in(nbInputs);
    for (int32_t i = 0; i < nbInputs; ++i)
    {
        in[i].dims = makeDims(shapes[i]);
        in[i].type = DataType::kFLOAT;
        in[i].format = TensorFormat::kLINEAR;
    }
    PluginTensorDesc out{};
    out.dims = makeDims(shapes[5]);
    out.type = DataType::kFLOAT;
    out.format = TensorFormat::kLINEAR;
    return plugin->onShapeChange(in.data(), nbInputs, &out, 1);
}

void checkConfigure(IPluginV3OneBuild* plugin, IPluginV3OneRuntime* rt)
{
    auto const good = exampleShapes();
    for (int32_t nbInputs = 3; nbInputs <= 5; ++nbInputs)
    {
        check(configure(plugin, good, nbInputs) == 0 && shapeChange(rt, good, nbInputs) == 0,
            std::to_string(nbInputs) + " inputs: configurePlugin / onShapeChange accept fitting shapes");
    }
    auto dynamic = good;
    for (auto* dims : {&dynamic[0], &dynamic[2], &dynamic[4], &dynamic[5]})
    {
        (*dims)[0] = -1;
        (*dims)[2] = -1;
    }
    check(configure(plugin, dynamic, 5) == 0, "configurePlugin accepts unknown (-1) N and H");
    struct Bad
    {
        char const* what;
        size_t tensor;
        size_t axis;
        int64_t value;
    };
    for (Bad const& bad : {Bad{"offset channels 16 instead of 18", 2, 1, 16}, Bad{"offset oH 5 instead of 4", 2, 2, 5},
             Bad{"mask channels 8 instead of 9", 4, 1, 8}, Bad{"bias of 5 for 4 output channels", 3, 0, 5},
             Bad{"weight C/group 3 for C 4", 1, 1, 3}, Bad{"y oW 6 instead of 5", 5, 3, 6},
             Bad{"y channels 3 instead of 4", 5, 1, 3}, Bad{"kernel larger than the input", 1, 2, 9}})
    {
        auto shapes = good;
        shapes[bad.tensor][bad.axis] = bad.value;
        check(configure(plugin, shapes, 5) != 0 && shapeChange(rt, shapes, 5) != 0,
            std::string{"configurePlugin / onShapeChange reject "} + bad.what);
    }
    check(configure(plugin, good, 2) != 0 && configure(plugin, good, 6) != 0, "configurePlugin rejects 2 and 6 inputs");
    auto wrongRank = good;
    wrongRank[4] = {1, 9, 20};
    check(configure(plugin, wrongRank, 5) != 0, "configurePlugin rejects a 3-D mask");
    // The one check that reaches enqueue without a GPU: shapes that do not fit are rejected before any launch.
    auto shapes = good;
    shapes[2][1] = 16;
    std::vector<PluginTensorDesc> in(5);
    for (int32_t i = 0; i < 5; ++i)
    {
        in[i].dims = makeDims(shapes[i]);
        in[i].type = DataType::kFLOAT;
        in[i].format = TensorFormat::kLINEAR;
    }
    PluginTensorDesc out{};
    out.dims = makeDims(shapes[5]);
    out.type = DataType::kFLOAT;
    void const* inputs[5] = {};
    void* outputs[1] = {};
    check(rt->enqueue(in.data(), &out, inputs, outputs, nullptr, nullptr) != 0,
        "enqueue rejects an offset that does not fit, before launching anything");
}

void checkBadFields(IPluginCreatorV3One* creator, CaptureLogger& logger)
{
    struct Bad
    {
        char const* what;
        Fields fields;
    };
    std::vector<Bad> bad;
    bad.push_back({"group 0", Fields().set("group", {0})});
    bad.push_back({"group -1", Fields().set("group", {-1})});
    bad.push_back({"offset_group 0", Fields().set("offset_group", {0})});
    bad.push_back({"strides 0", Fields().set("strides", {0, 1})});
    bad.push_back({"dilations -1", Fields().set("dilations", {1, -1})});
    bad.push_back({"negative pads", Fields().set("pads", {0, -1, 0, 0})});
    bad.push_back({"pads with 2 values", Fields().set("pads", {1, 1})});
    bad.push_back({"strides with 3 values", Fields().set("strides", {1, 1, 1})});
    bad.push_back({"group with 2 values", Fields().set("group", {1, 2})});
    bad.push_back({"group as FLOAT32", Fields().set("group", {1}, PluginFieldType::kFLOAT32)});
    bad.push_back({"strides without data", Fields().set("strides", {})});
    bad.push_back({"an unknown field 'stride'", Fields().set("stride", {1, 1})});
    bad.push_back({"an INT64 group beyond int32", Fields().setInt64("group", {int64_t{1} << 40})});
    for (Bad& b : bad)
    {
        size_t const before = logger.errors.size();
        PluginPtr plugin(creator->createPlugin("bad", b.fields.collection(), TensorRTPhase::kBUILD));
        check(plugin == nullptr && logger.errors.size() > before,
            std::string{"createPlugin rejects "} + b.what + " and reports it through TensorRT's logger"
                + (logger.errors.size() > before ? " (\"" + logger.errors.back() + "\")" : ""));
    }
    PluginField nameless(nullptr, nullptr, PluginFieldType::kINT32, 0);
    PluginFieldCollection fc{1, &nameless};
    check(PluginPtr(creator->createPlugin("bad", &fc, TensorRTPhase::kBUILD)) == nullptr,
        "createPlugin rejects a field without a name (no crash)");
    Fields wide;
    wide.setInt64("group", {2}).setInt64("strides", {2, 1});
    PluginPtr plugin(creator->createPlugin("wide", wide.collection(), TensorRTPhase::kBUILD));
    check(plugin != nullptr && serialized(plugin.get())["group"] == std::vector<int32_t>{2}
            && serialized(plugin.get())["strides"] == std::vector<int32_t>{2, 1},
        "createPlugin accepts INT64 fields within the int32 range");
}
} // namespace

//! What the library looks up at load time to register itself (in a TensorRT process: libnvinfer's).
extern "C" __attribute__((visibility("default"))) IPluginRegistry* getPluginRegistry() noexcept
{
    return &gRegistry;
}

int main(int argc, char** argv)
{
    if (argc != 3)
    {
        std::cerr << "usage: " << argv[0] << " <libgskit_deform_conv2d.so> <spec.txt>\n";
        return 2;
    }
    Spec spec;
    try
    {
        spec = readSpec(argv[2]);
    }
    catch (std::exception const& e)
    {
        std::cerr << e.what() << "\n";
        return 2;
    }
    void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    check(library != nullptr, std::string{"dlopen "} + argv[1] + (library ? "" : std::string{": "} + dlerror()));
    if (library == nullptr)
    {
        std::cout << gPassed << " checks passed, " << gFailed << " failed\n";
        return 1;
    }
    using GetCreators = IPluginCreatorInterface* const* (*) (int32_t&);
    using SetLoggerFinder = void (*)(ILoggerFinder*);
    auto getCreators = reinterpret_cast<GetCreators>(dlsym(library, "getCreators"));
    auto setLoggerFinder = reinterpret_cast<SetLoggerFinder>(dlsym(library, "setLoggerFinder"));
    check(getCreators != nullptr && setLoggerFinder != nullptr,
        "exports getCreators and setLoggerFinder (what IPluginRegistry::loadLibrary looks up)");
    if (getCreators == nullptr || setLoggerFinder == nullptr)
    {
        std::cout << gPassed << " checks passed, " << gFailed << " failed\n";
        return 1;
    }
    CaptureLogger logger;
    Finder finder(&logger);
    setLoggerFinder(&finder);

    int32_t nbCreators = -1;
    // Loading the library (dlopen above) registered its creator with the registry of the "loaded TensorRT",
    // which is this executable's getPluginRegistry() below; getCreators() takes that registration back, as
    // IPluginRegistry::loadLibrary registers the creators itself.
    check(gRegistry.registered.size() == 1 && gRegistry.namespaces == std::vector<std::string>{spec.nameSpace},
        "loading the library registers one creator under namespace '" + spec.nameSpace
            + "' with the loaded TensorRT's registry (getPluginRegistry found at run time)");
    IPluginCreatorInterface* const* creators = getCreators(nbCreators);
    check(creators != nullptr && nbCreators == 1 && creators[0] != nullptr, "getCreators returns one creator");
    check(gRegistry.registered.size() == 1 && gRegistry.deregistered.size() == 1
            && gRegistry.deregistered[0] == gRegistry.registered[0] && creators != nullptr
            && creators[0] == gRegistry.registered[0],
        "getCreators withdraws the load-time registration of that same creator (loadLibrary would see a duplicate)");
    getCreators(nbCreators);
    check(gRegistry.deregistered.size() == 1, "a second getCreators call deregisters nothing more");
    auto* creator = static_cast<IPluginCreatorV3One*>(creators[0]);
    checkCreator(creator, spec);

    // Defaults: no fields at all, and every spec default given explicitly, serialize to the spec defaults.
    Values defaults;
    for (SpecAttribute const& attribute : spec.attributes)
    {
        defaults[attribute.name] = attribute.defaults;
    }
    PluginPtr empty(creator->createPlugin("defaults", nullptr, TensorRTPhase::kBUILD));
    check(empty != nullptr && serialized(empty.get()) == defaults,
        "createPlugin without fields serializes the spec defaults:" + (empty ? show(serialized(empty.get())) : ""));
    Fields explicitDefaults = fieldsOf(defaults);
    PluginPtr given(creator->createPlugin("defaults", explicitDefaults.collection(), TensorRTPhase::kBUILD));
    check(given != nullptr && serialized(given.get()) == defaults, "createPlugin with the spec defaults given");
    if (empty)
    {
        checkPlugin(empty.get(), spec, "default plugin");
        check(build(empty.get())->getNbOutputs() == 1, "getNbOutputs is 1");
        check(build(empty.get())->getWorkspaceSize(nullptr, 3, nullptr, 1) == 0, "getWorkspaceSize is 0");
        checkTypes(build(empty.get()));
        for (int32_t nbInputs = spec.minInputs; nbInputs <= spec.maxInputs; ++nbInputs)
        {
            checkFormats(build(empty.get()), nbInputs);
        }
        checkConfigure(build(empty.get()), runtime(empty.get()));
    }

    // Non-default values: serialize, re-create from the serialized fields (as TensorRT does at run time),
    // clone, attach to a context: every copy holds the same values.
    Values custom{{"strides", {2, 1}}, {"pads", {1, 2, 3, 4}}, {"dilations", {2, 3}}, {"group", {2}},
        {"offset_group", {4}}};
    Fields customFields = fieldsOf(custom);
    PluginPtr original(creator->createPlugin("custom", customFields.collection(), TensorRTPhase::kBUILD));
    check(original != nullptr && serialized(original.get()) == custom,
        "createPlugin with non-default fields serializes them:" + (original ? show(serialized(original.get())) : ""));
    if (original)
    {
        // The serialized fields as TensorRT stores them in the engine; the plugin may be gone by then.
        Values const stored = serialized(original.get());
        Fields storedFields = fieldsOf(stored);
        PluginPtr restored(creator->createPlugin("custom", storedFields.collection(), TensorRTPhase::kRUNTIME));
        check(restored != nullptr && serialized(restored.get()) == custom,
            "getFieldsToSerialize round trip: a plugin created from them (kRUNTIME) has the same fields");
        PluginPtr cloned(original->clone());
        check(cloned != nullptr && serialized(cloned.get()) == custom, "clone keeps the fields");
        FakeResourceContext context;
        PluginPtr attached(runtime(original.get())->attachToContext(&context));
        check(attached != nullptr && attached.get() != original.get() && serialized(attached.get()) == custom,
            "attachToContext returns a new plugin with the same fields");
        if (cloned)
        {
            original.reset(); // a clone must not point into the object it was cloned from
            check(serialized(cloned.get()) == custom, "the clone's fields outlive the original");
            checkPlugin(cloned.get(), spec, "clone");
        }
    }

    for (size_t i = 0; i < spec.shapes.size(); ++i)
    {
        ShapeCase const& shape = spec.shapes[i];
        Fields fields = fieldsOf(shape.attrs);
        PluginPtr plugin(creator->createPlugin("shape", fields.collection(), TensorRTPhase::kBUILD));
        std::string const label = "shape case " + std::to_string(i) + show(shape.attrs);
        check(plugin != nullptr, label + ": created");
        if (plugin)
        {
            checkShapes(build(plugin.get()), shape, label);
        }
    }

    checkBadFields(creator, logger);

    std::cout << gPassed << " checks passed, " << gFailed << " failed\n";
    return gFailed == 0 ? 0 : 1;
}
