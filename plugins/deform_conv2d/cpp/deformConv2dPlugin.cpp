// DeformConv2d TensorRT plugin: shape rule, format support, serialization of the attributes, enqueue; and the
// library's entry points (getCreators / setLoggerFinder, and registration when loaded with dlopen).
#include "deformConv2dPlugin.h"

#include "deformConv2dKernel.h"

#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <exception>
#include <iostream>
#include <limits>

using namespace nvinfer1;

namespace gskit
{
namespace
{
char const* const kPLUGIN_NAME{"DeformConv2d"};
char const* const kPLUGIN_VERSION{"1"};
char const* const kPLUGIN_NAMESPACE{"gskit"};
int32_t constexpr kMIN_INPUTS{3};
int32_t constexpr kMAX_INPUTS{5};

//! Set by TensorRT through setLoggerFinder() when it loads the library with IPluginRegistry::loadLibrary().
std::atomic<ILoggerFinder*> gLoggerFinder{nullptr};

//! Reports through TensorRT's logger when TensorRT gave us a way to find it, else on stderr. Never throws.
void logError(std::string const& message) noexcept
{
    try
    {
        std::string const text = std::string{"gskit::DeformConv2d plugin: "} + message;
        ILoggerFinder* const finder = gLoggerFinder.load();
        ILogger* const logger = finder != nullptr ? finder->findLogger() : nullptr;
        if (logger != nullptr)
        {
            logger->log(ILogger::Severity::kERROR, text.c_str());
        }
        else
        {
            std::cerr << text << std::endl;
        }
    }
    catch (...)
    {
    }
}

//! Reads an integer field of exactly `size` values (INT32, or INT64 within the int32 range) into dst.
//! Returns why not, or an empty string.
std::string readInts(PluginField const& field, int32_t* dst, int32_t size)
{
    if (field.length != size || field.data == nullptr)
    {
        return "must hold " + std::to_string(size) + " value(s), got " + std::to_string(field.length)
            + (field.data == nullptr ? " without data" : "");
    }
    if (field.type == PluginFieldType::kINT32)
    {
        std::memcpy(dst, field.data, sizeof(int32_t) * size);
        return {};
    }
    if (field.type == PluginFieldType::kINT64)
    {
        auto const* src = static_cast<int64_t const*>(field.data);
        for (int32_t i = 0; i < size; ++i)
        {
            if (src[i] < std::numeric_limits<int32_t>::min() || src[i] > std::numeric_limits<int32_t>::max())
            {
                return "value " + std::to_string(src[i]) + " does not fit int32";
            }
        }
        for (int32_t i = 0; i < size; ++i)
        {
            dst[i] = static_cast<int32_t>(src[i]);
        }
        return {};
    }
    return "must be INT32 (or INT64), got PluginFieldType " + std::to_string(static_cast<int32_t>(field.type));
}

std::string dimsToString(Dims const& dims)
{
    std::string text{"("};
    for (int32_t i = 0; i < dims.nbDims; ++i)
    {
        text += (i > 0 ? ", " : "") + std::to_string(dims.d[i]);
    }
    return text + ")";
}

//! Spatial output size, as reference.output_size: (size + pads - dilation * (kernel - 1) - 1) // stride + 1.
int64_t outputSize(int64_t size, int64_t kernel, int32_t stride, int32_t padBegin, int32_t padEnd, int32_t dilation)
{
    int64_t const numerator = size + padBegin + padEnd - static_cast<int64_t>(dilation) * (kernel - 1) - 1;
    // Floor division, like Python's // and DimensionOperation::kFLOOR_DIV (stride > 0).
    int64_t const quotient = numerator >= 0 ? numerator / stride : -((-numerator + stride - 1) / stride);
    return quotient + 1;
}

DeformConv2dPluginCreator& theCreator()
{
    static DeformConv2dPluginCreator creator;
    return creator;
}
} // namespace

std::string DeformConv2dPlugin::Attributes::check() const
{
    if (strides[0] <= 0 || strides[1] <= 0)
    {
        return "strides must be positive, got [" + std::to_string(strides[0]) + ", " + std::to_string(strides[1])
            + "]";
    }
    if (dilations[0] <= 0 || dilations[1] <= 0)
    {
        return "dilations must be positive, got [" + std::to_string(dilations[0]) + ", "
            + std::to_string(dilations[1]) + "]";
    }
    for (int32_t const pad : pads)
    {
        if (pad < 0)
        {
            return "pads must not be negative, got " + std::to_string(pad);
        }
    }
    if (group <= 0)
    {
        return "group must be positive, got " + std::to_string(group);
    }
    if (offsetGroup <= 0)
    {
        return "offset_group must be positive, got " + std::to_string(offsetGroup);
    }
    return {};
}

DeformConv2dPlugin::DeformConv2dPlugin(Attributes const& attrs)
    : mAttrs(attrs)
{
    mFields = {
        PluginField("strides", mAttrs.strides.data(), PluginFieldType::kINT32, 2),
        PluginField("pads", mAttrs.pads.data(), PluginFieldType::kINT32, 4),
        PluginField("dilations", mAttrs.dilations.data(), PluginFieldType::kINT32, 2),
        PluginField("group", &mAttrs.group, PluginFieldType::kINT32, 1),
        PluginField("offset_group", &mAttrs.offsetGroup, PluginFieldType::kINT32, 1),
    };
    mFieldCollection.nbFields = static_cast<int32_t>(mFields.size());
    mFieldCollection.fields = mFields.data();
}

IPluginCapability* DeformConv2dPlugin::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuild*>(this);
    case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
    case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
    }
    return nullptr;
}

IPluginV3* DeformConv2dPlugin::clone() noexcept
{
    try
    {
        auto* plugin = new DeformConv2dPlugin(mAttrs);
        plugin->mNbInputs = mNbInputs;
        return plugin;
    }
    catch (std::exception const& e)
    {
        logError(e.what());
    }
    return nullptr;
}

char const* DeformConv2dPlugin::getPluginName() const noexcept
{
    return kPLUGIN_NAME;
}

char const* DeformConv2dPlugin::getPluginVersion() const noexcept
{
    return kPLUGIN_VERSION;
}

char const* DeformConv2dPlugin::getPluginNamespace() const noexcept
{
    return kPLUGIN_NAMESPACE;
}

std::string DeformConv2dPlugin::checkShapes(Dims const* inputs, int32_t nbInputs, Dims const* output) const
{
    if (nbInputs < kMIN_INPUTS || nbInputs > kMAX_INPUTS)
    {
        return "expects 3 to 5 inputs (x, weight, offset[, bias[, mask]]), got " + std::to_string(nbInputs);
    }
    char const* const names[kMAX_INPUTS] = {"x", "weight", "offset", "bias", "mask"};
    int32_t const ranks[kMAX_INPUTS] = {4, 4, 4, 1, 4};
    for (int32_t i = 0; i < nbInputs; ++i)
    {
        if (inputs[i].nbDims != ranks[i])
        {
            return std::string{names[i]} + " must be " + std::to_string(ranks[i]) + "-D, got "
                + dimsToString(inputs[i]);
        }
    }
    if (output != nullptr && output->nbDims != 4)
    {
        return "y must be 4-D, got " + dimsToString(*output);
    }
    // A dimension of -1 (unknown until run time) is not checked; every known one must fit.
    auto mismatch = [](int64_t actual, int64_t expected) { return actual >= 0 && expected >= 0 && actual != expected; };
    Dims const& x = inputs[0];
    Dims const& w = inputs[1];
    Dims const& offset = inputs[2];
    int64_t const c = x.d[1];
    int64_t const cOut = w.d[0];
    int64_t const taps = w.d[2] >= 0 && w.d[3] >= 0 ? w.d[2] * w.d[3] : -1;
    // Built only for a message: enqueue runs this check on every call.
    auto shapes = [&]() {
        return " (x " + dimsToString(x) + ", weight " + dimsToString(w) + ", group " + std::to_string(mAttrs.group)
            + ", offset_group " + std::to_string(mAttrs.offsetGroup) + ")";
    };
    if ((c >= 0 && c % mAttrs.group != 0) || (cOut >= 0 && cOut % mAttrs.group != 0)
        || mismatch(w.d[1], c >= 0 ? c / mAttrs.group : -1))
    {
        return "weight must be (C_out, C / group, kH, kW) with C and C_out divisible by group" + shapes();
    }
    if (c >= 0 && c % mAttrs.offsetGroup != 0)
    {
        return "the input channels must be divisible by offset_group" + shapes();
    }
    int64_t spatial[2] = {-1, -1};
    for (int32_t axis = 0; axis < 2; ++axis)
    {
        if (x.d[2 + axis] >= 0 && w.d[2 + axis] >= 0)
        {
            spatial[axis] = outputSize(x.d[2 + axis], w.d[2 + axis], mAttrs.strides[axis], mAttrs.pads[axis],
                mAttrs.pads[axis + 2], mAttrs.dilations[axis]);
            if (spatial[axis] <= 0)
            {
                return "the output would be empty: the dilated kernel is larger than the padded input" + shapes();
            }
        }
    }
    if (mismatch(offset.d[0], x.d[0]) || mismatch(offset.d[1], taps >= 0 ? 2 * mAttrs.offsetGroup * taps : -1)
        || mismatch(offset.d[2], spatial[0]) || mismatch(offset.d[3], spatial[1]))
    {
        return "offset must be (N, offset_group * kH * kW * 2, oH, oW), got " + dimsToString(offset) + shapes();
    }
    if (nbInputs > 3 && mismatch(inputs[3].d[0], cOut))
    {
        return "bias must be (C_out,), got " + dimsToString(inputs[3]) + shapes();
    }
    if (nbInputs > 4)
    {
        Dims const& mask = inputs[4];
        if (mismatch(mask.d[0], x.d[0]) || mismatch(mask.d[1], taps >= 0 ? mAttrs.offsetGroup * taps : -1)
            || mismatch(mask.d[2], spatial[0]) || mismatch(mask.d[3], spatial[1]))
        {
            return "mask must be (N, offset_group * kH * kW, oH, oW), got " + dimsToString(mask) + shapes();
        }
    }
    if (output != nullptr
        && (mismatch(output->d[0], x.d[0]) || mismatch(output->d[1], cOut) || mismatch(output->d[2], spatial[0])
            || mismatch(output->d[3], spatial[1])))
    {
        return "y must be (N, C_out, oH, oW), got " + dimsToString(*output) + shapes();
    }
    return {};
}

namespace
{
Dims const& dimsOf(PluginTensorDesc const& desc)
{
    return desc.dims;
}
Dims const& dimsOf(DynamicPluginTensorDesc const& desc)
{
    return desc.desc.dims;
}
} // namespace

template <typename Desc>
bool DeformConv2dPlugin::shapesFit(Desc const* inputs, int32_t nbInputs, Desc const& output) const
{
    Dims dims[kMAX_INPUTS];
    for (int32_t i = 0; i < nbInputs; ++i)
    {
        dims[i] = dimsOf(inputs[i]);
    }
    std::string const error = checkShapes(dims, nbInputs, &dimsOf(output));
    if (!error.empty())
    {
        logError(error);
        return false;
    }
    return true;
}

template <typename Desc>
int32_t DeformConv2dPlugin::acceptShapes(
    Desc const* inputs, int32_t nbInputs, Desc const* outputs, int32_t nbOutputs) noexcept
{
    try
    {
        if (nbOutputs != 1 || nbInputs < kMIN_INPUTS || nbInputs > kMAX_INPUTS)
        {
            logError("expects 3 to 5 inputs (x, weight, offset[, bias[, mask]]) and 1 output");
            return -1;
        }
        if (!shapesFit(inputs, nbInputs, outputs[0]))
        {
            return -1;
        }
        mNbInputs = nbInputs;
        return 0;
    }
    catch (std::exception const& e)
    {
        logError(e.what());
    }
    return -1;
}

int32_t DeformConv2dPlugin::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    return acceptShapes(in, nbInputs, out, nbOutputs);
}

int32_t DeformConv2dPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    if (nbOutputs != 1 || nbInputs < kMIN_INPUTS || nbInputs > kMAX_INPUTS)
    {
        return -1;
    }
    outputTypes[0] = inputTypes[0];
    return 0;
}

int32_t DeformConv2dPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const* /*shapeInputs*/,
    int32_t /*nbShapeInputs*/, DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& exprBuilder) noexcept
{
    if (nbInputs < kMIN_INPUTS || nbInputs > kMAX_INPUTS || nbOutputs != 1)
    {
        logError("expects 3 to 5 inputs (x, weight, offset[, bias[, mask]]) and 1 output");
        return -1;
    }
    if (inputs[0].nbDims != 4 || inputs[1].nbDims != 4 || inputs[2].nbDims != 4)
    {
        logError("x, weight and offset must be 4-D");
        return -1;
    }
    // Mirrors spec.infer: (size + pads - dilation * (k - 1) - 1) // stride + 1.
    auto spatial = [&](int32_t axis) {
        IDimensionExpr const* size = inputs[0].d[2 + axis];
        IDimensionExpr const* kernel = inputs[1].d[2 + axis];
        IDimensionExpr const* one = exprBuilder.constant(1);
        int32_t const padSum = mAttrs.pads[axis] + mAttrs.pads[axis + 2];
        IDimensionExpr const* padded
            = exprBuilder.operation(DimensionOperation::kSUM, *size, *exprBuilder.constant(padSum));
        IDimensionExpr const* kernelMinusOne = exprBuilder.operation(DimensionOperation::kSUB, *kernel, *one);
        IDimensionExpr const* span = exprBuilder.operation(
            DimensionOperation::kPROD, *kernelMinusOne, *exprBuilder.constant(mAttrs.dilations[axis]));
        IDimensionExpr const* numerator = exprBuilder.operation(
            DimensionOperation::kSUB, *exprBuilder.operation(DimensionOperation::kSUB, *padded, *span), *one);
        IDimensionExpr const* quotient = exprBuilder.operation(
            DimensionOperation::kFLOOR_DIV, *numerator, *exprBuilder.constant(mAttrs.strides[axis]));
        return exprBuilder.operation(DimensionOperation::kSUM, *quotient, *one);
    };
    outputs[0].nbDims = 4;
    outputs[0].d[0] = inputs[0].d[0];
    outputs[0].d[1] = inputs[1].d[0];
    outputs[0].d[2] = spatial(0);
    outputs[0].d[3] = spatial(1);
    return 0;
}

bool DeformConv2dPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    if (inOut == nullptr || pos < 0 || pos >= nbInputs + nbOutputs)
    {
        return false;
    }
    // Every input and the output: linear, float32 or float16, all of x's type (the kernel reads one type).
    PluginTensorDesc const& desc = inOut[pos].desc;
    if (desc.format != TensorFormat::kLINEAR)
    {
        return false;
    }
    if (pos == 0)
    {
        return desc.type == DataType::kFLOAT || desc.type == DataType::kHALF;
    }
    return desc.type == inOut[0].desc.type;
}

int32_t DeformConv2dPlugin::getNbOutputs() const noexcept
{
    return 1;
}

size_t DeformConv2dPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* /*inputs*/, int32_t /*nbInputs*/,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    return 0;
}

int32_t DeformConv2dPlugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    return acceptShapes(in, nbInputs, out, nbOutputs);
}

int32_t DeformConv2dPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* outputDesc,
    void const* const* inputs, void* const* outputs, void* /*workspace*/, cudaStream_t stream) noexcept
{
    try
    {
        if (!shapesFit(inputDesc, mNbInputs, outputDesc[0]))
        {
            return -1;
        }
        DataType const dataType = inputDesc[0].type;
        if (dataType != DataType::kFLOAT && dataType != DataType::kHALF)
        {
            logError("x must be float32 or float16");
            return -1;
        }
        Dims const& x = inputDesc[0].dims;
        Dims const& w = inputDesc[1].dims;
        Dims const& y = outputDesc[0].dims;
        DeformConv2dParams p{};
        p.n = static_cast<int32_t>(x.d[0]);
        p.c = static_cast<int32_t>(x.d[1]);
        p.h = static_cast<int32_t>(x.d[2]);
        p.w = static_cast<int32_t>(x.d[3]);
        p.cOut = static_cast<int32_t>(w.d[0]);
        p.kH = static_cast<int32_t>(w.d[2]);
        p.kW = static_cast<int32_t>(w.d[3]);
        p.oH = static_cast<int32_t>(y.d[2]);
        p.oW = static_cast<int32_t>(y.d[3]);
        p.strideH = mAttrs.strides[0];
        p.strideW = mAttrs.strides[1];
        p.padTop = mAttrs.pads[0];
        p.padLeft = mAttrs.pads[1];
        p.dilationH = mAttrs.dilations[0];
        p.dilationW = mAttrs.dilations[1];
        p.group = mAttrs.group;
        p.offsetGroup = mAttrs.offsetGroup;
        DcnDataType const type = dataType == DataType::kHALF ? DcnDataType::kHALF : DcnDataType::kFLOAT;
        void const* bias = mNbInputs > 3 ? inputs[3] : nullptr;
        void const* mask = mNbInputs > 4 ? inputs[4] : nullptr;
        cudaError_t const status
            = launchDeformConv2d(p, type, inputs[0], inputs[1], inputs[2], bias, mask, outputs[0], stream);
        if (status != cudaSuccess)
        {
            logError(cudaGetErrorString(status));
            return -1;
        }
        return 0;
    }
    catch (std::exception const& e)
    {
        logError(e.what());
    }
    return -1;
}

IPluginV3* DeformConv2dPlugin::attachToContext(IPluginResourceContext* /*context*/) noexcept
{
    return clone();
}

PluginFieldCollection const* DeformConv2dPlugin::getFieldsToSerialize() noexcept
{
    return &mFieldCollection;
}

DeformConv2dPluginCreator::DeformConv2dPluginCreator()
{
    mFields = {
        PluginField("strides", nullptr, PluginFieldType::kINT32, 2),
        PluginField("pads", nullptr, PluginFieldType::kINT32, 4),
        PluginField("dilations", nullptr, PluginFieldType::kINT32, 2),
        PluginField("group", nullptr, PluginFieldType::kINT32, 1),
        PluginField("offset_group", nullptr, PluginFieldType::kINT32, 1),
    };
    mFieldCollection.nbFields = static_cast<int32_t>(mFields.size());
    mFieldCollection.fields = mFields.data();
}

char const* DeformConv2dPluginCreator::getPluginName() const noexcept
{
    return kPLUGIN_NAME;
}

char const* DeformConv2dPluginCreator::getPluginVersion() const noexcept
{
    return kPLUGIN_VERSION;
}

char const* DeformConv2dPluginCreator::getPluginNamespace() const noexcept
{
    return kPLUGIN_NAMESPACE;
}

PluginFieldCollection const* DeformConv2dPluginCreator::getFieldNames() noexcept
{
    return &mFieldCollection;
}

IPluginV3* DeformConv2dPluginCreator::createPlugin(
    char const* name, PluginFieldCollection const* fc, TensorRTPhase /*phase*/) noexcept
{
    try
    {
        // A field left out keeps its default (spec.py); the ONNX parser passes only the attributes the node has.
        DeformConv2dPlugin::Attributes attrs;
        for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i)
        {
            PluginField const& field = fc->fields[i];
            std::string const fieldName{field.name != nullptr ? field.name : ""};
            std::string error;
            if (fieldName == "strides")
            {
                error = readInts(field, attrs.strides.data(), 2);
            }
            else if (fieldName == "pads")
            {
                error = readInts(field, attrs.pads.data(), 4);
            }
            else if (fieldName == "dilations")
            {
                error = readInts(field, attrs.dilations.data(), 2);
            }
            else if (fieldName == "group")
            {
                error = readInts(field, &attrs.group, 1);
            }
            else if (fieldName == "offset_group")
            {
                error = readInts(field, &attrs.offsetGroup, 1);
            }
            else
            {
                error = "is not a field of this plugin (strides, pads, dilations, group, offset_group)";
            }
            if (!error.empty())
            {
                logError("node '" + std::string{name != nullptr ? name : ""} + "': field '" + fieldName + "' "
                    + error);
                return nullptr;
            }
        }
        std::string const error = attrs.check();
        if (!error.empty())
        {
            logError("node '" + std::string{name != nullptr ? name : ""} + "': " + error);
            return nullptr;
        }
        return new DeformConv2dPlugin(attrs);
    }
    catch (std::exception const& e)
    {
        logError(e.what());
    }
    return nullptr;
}

namespace
{
//! getPluginRegistry() of a libnvinfer already loaded into this process, or nullptr. Looked up at run time, so
//! that the library needs the TensorRT headers only and can be loaded where there is no TensorRT at all.
IPluginRegistry* findLoadedPluginRegistry() noexcept
{
    void* symbol = dlsym(RTLD_DEFAULT, "getPluginRegistry");
    if (symbol == nullptr)
    {
        // Python's `import tensorrt` loads libnvinfer with RTLD_LOCAL: ask for that copy by soname.
        std::string const soname = "libnvinfer.so." + std::to_string(NV_TENSORRT_MAJOR);
        if (void* handle = dlopen(soname.c_str(), RTLD_LAZY | RTLD_NOLOAD))
        {
            symbol = dlsym(handle, "getPluginRegistry");
            dlclose(handle); // only drops the reference RTLD_NOLOAD took; the library stays loaded
        }
    }
    using GetPluginRegistry = IPluginRegistry* (*) ();
    return symbol != nullptr ? reinterpret_cast<GetPluginRegistry>(symbol)() : nullptr;
}

//! The registry the creator was registered with when the library was loaded, until getCreators() is called.
std::atomic<IPluginRegistry*> gLoadTimeRegistry{nullptr};

//! ctypes.CDLL / dlopen (gskit, Polygraphy's LoadPlugins, trtexec --staticPlugins): register the creator under
//! "gskit" with the global registry of the TensorRT already loaded. Without one, nothing happens here and the
//! library still serves IPluginRegistry::loadLibrary() through getCreators().
struct LoadTimeRegistration
{
    LoadTimeRegistration() noexcept
    {
        IPluginRegistry* const registry = findLoadedPluginRegistry();
        if (registry == nullptr)
        {
            return;
        }
        if (registry->registerCreator(theCreator(), kPLUGIN_NAMESPACE))
        {
            gLoadTimeRegistry = registry;
        }
        else
        {
            logError("registration with the TensorRT plugin registry failed (library loaded twice?)");
        }
    }
};
LoadTimeRegistration const kLOAD_TIME_REGISTRATION{};
} // namespace

} // namespace gskit

extern "C" void setLoggerFinder(ILoggerFinder* finder) noexcept
{
    gskit::gLoggerFinder = finder;
}

extern "C" IPluginCreatorInterface* const* getCreators(int32_t& nbCreators) noexcept
{
    // loadLibrary() registers what this returns and fails when the same name/version/namespace is registered
    // already: undo the load-time registration that its own dlopen triggered.
    if (IPluginRegistry* const registry = gskit::gLoadTimeRegistry.exchange(nullptr))
    {
        registry->deregisterCreator(gskit::theCreator());
    }
    static IPluginCreatorInterface* const kCREATORS[] = {&gskit::theCreator()};
    nbCreators = 1;
    return kCREATORS;
}
