// DeformConv2d TensorRT plugin: shape rule, format support, serialization of the attributes, enqueue.
#include "deformConv2dPlugin.h"

#include "deformConv2dKernel.h"

#include <cstring>
#include <exception>
#include <iostream>

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

void logError(char const* message) noexcept
{
    std::cerr << "gskit::DeformConv2d plugin: " << message << std::endl;
}

//! Copies an INT32 field of exactly `size` values; false (and a message) when it has another type or length.
bool readInts(PluginField const& field, int32_t* dst, int32_t size) noexcept
{
    if (field.type != PluginFieldType::kINT32 || field.length != size || field.data == nullptr)
    {
        std::cerr << "gskit::DeformConv2d plugin: field '" << field.name << "' must be " << size
                  << " int32 value(s), got " << field.length << std::endl;
        return false;
    }
    std::memcpy(dst, field.data, sizeof(int32_t) * size);
    return true;
}
} // namespace

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

int32_t DeformConv2dPlugin::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    if (nbInputs < kMIN_INPUTS || nbInputs > kMAX_INPUTS || nbOutputs != 1)
    {
        logError("expects 3 to 5 inputs (x, weight, offset[, bias[, mask]]) and 1 output");
        return -1;
    }
    mNbInputs = nbInputs;
    return 0;
}

int32_t DeformConv2dPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    if (nbOutputs != 1 || nbInputs < kMIN_INPUTS)
    {
        return -1;
    }
    outputTypes[0] = inputTypes[0];
    return 0;
}

int32_t DeformConv2dPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const* /*shapeInputs*/,
    int32_t /*nbShapeInputs*/, DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& exprBuilder) noexcept
{
    if (nbInputs < kMIN_INPUTS || nbOutputs != 1 || inputs[0].nbDims != 4 || inputs[1].nbDims != 4)
    {
        logError("x and weight must be 4-D");
        return -1;
    }
    // Mirrors spec.infer: (size + pads - dilation * (k - 1) - 1) // stride + 1.
    auto spatial = [&](int32_t axis) {
        IDimensionExpr const* size = inputs[0].d[2 + axis];
        IDimensionExpr const* kernel = inputs[1].d[2 + axis];
        IDimensionExpr const* one = exprBuilder.constant(1);
        int32_t const padSum = mAttrs.pads[axis] + mAttrs.pads[axis + 2];
        IDimensionExpr const* padded = exprBuilder.operation(DimensionOperation::kSUM, *size, *exprBuilder.constant(padSum));
        IDimensionExpr const* span = exprBuilder.operation(DimensionOperation::kPROD,
            *exprBuilder.operation(DimensionOperation::kSUB, *kernel, *one), *exprBuilder.constant(mAttrs.dilations[axis]));
        IDimensionExpr const* numerator = exprBuilder.operation(DimensionOperation::kSUB,
            *exprBuilder.operation(DimensionOperation::kSUB, *padded, *span), *one);
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
    PluginTensorDesc const& desc = inOut[pos].desc;
    if (desc.format != TensorFormat::kLINEAR)
    {
        return false;
    }
    if (pos == 0)
    {
        return desc.type == DataType::kFLOAT || desc.type == DataType::kHALF;
    }
    return desc.type == inOut[0].desc.type && pos < nbInputs + nbOutputs;
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
    PluginTensorDesc const* /*in*/, int32_t nbInputs, PluginTensorDesc const* /*out*/, int32_t nbOutputs) noexcept
{
    if (nbInputs < kMIN_INPUTS || nbInputs > kMAX_INPUTS || nbOutputs != 1)
    {
        return -1;
    }
    mNbInputs = nbInputs;
    return 0;
}

int32_t DeformConv2dPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* outputDesc,
    void const* const* inputs, void* const* outputs, void* /*workspace*/, cudaStream_t stream) noexcept
{
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
    if (p.group <= 0 || p.offsetGroup <= 0 || p.c % p.group != 0 || p.cOut % p.group != 0
        || p.c % p.offsetGroup != 0 || w.d[1] != p.c / p.group)
    {
        logError("weight shape, group and offset_group do not fit the input channels");
        return -1;
    }
    DcnDataType const type = inputDesc[0].type == DataType::kHALF ? DcnDataType::kHALF : DcnDataType::kFLOAT;
    void const* bias = mNbInputs > 3 ? inputs[3] : nullptr;
    void const* mask = mNbInputs > 4 ? inputs[4] : nullptr;
    cudaError_t const status = launchDeformConv2d(p, type, inputs[0], inputs[1], inputs[2], bias, mask, outputs[0], stream);
    if (status != cudaSuccess)
    {
        logError(cudaGetErrorString(status));
        return -1;
    }
    return 0;
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
    char const* /*name*/, PluginFieldCollection const* fc, TensorRTPhase /*phase*/) noexcept
{
    try
    {
        DeformConv2dPlugin::Attributes attrs;
        for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i)
        {
            PluginField const& field = fc->fields[i];
            std::string const name{field.name};
            bool ok = true;
            if (name == "strides")
            {
                ok = readInts(field, attrs.strides.data(), 2);
            }
            else if (name == "pads")
            {
                ok = readInts(field, attrs.pads.data(), 4);
            }
            else if (name == "dilations")
            {
                ok = readInts(field, attrs.dilations.data(), 2);
            }
            else if (name == "group")
            {
                ok = readInts(field, &attrs.group, 1);
            }
            else if (name == "offset_group")
            {
                ok = readInts(field, &attrs.offsetGroup, 1);
            }
            if (!ok)
            {
                return nullptr;
            }
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
//! Registers the creator under namespace "gskit" when the library is loaded (ctypes.CDLL / dlopen), with the
//! namespace given explicitly so that the registry key and the creator's getPluginNamespace() agree.
struct CreatorRegistration
{
    CreatorRegistration()
    {
        static DeformConv2dPluginCreator creator;
        if (!getPluginRegistry()->registerCreator(creator, kPLUGIN_NAMESPACE))
        {
            logError("registration with the TensorRT plugin registry failed (loaded twice?)");
        }
    }
};
CreatorRegistration const kCREATOR_REGISTRATION{};
} // namespace

} // namespace gskit
