-- Argo CD health check for kiln.dev ModelArtifact (Lua 5.1, as Argo CD runs it).
-- Install as argocd-cm key resource.customizations.health.kiln.dev_ModelArtifact (README,
-- "Argo CD"). The operator validates the spec and writes kstatus conditions:
--   Healthy      Ready=True for the current generation
--   Degraded     Stalled=True (the spec is invalid; the message says what to fix)
--   Progressing  not judged yet
local hs = { status = "Progressing", message = "waiting for the kiln operator" }
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
local generation = obj.metadata.generation
if generation ~= nil and (obj.status.observedGeneration == nil or obj.status.observedGeneration < generation) then
  hs.message = "waiting for the operator to observe generation " .. generation
  return hs
end
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Stalled" and c.status == "True" then
    hs.status = "Degraded"
    hs.message = (c.reason or "") .. ": " .. (c.message or "")
    return hs
  end
  if c.type == "Ready" and c.status == "True" then
    hs.status = "Healthy"
    hs.message = c.message or ""
  end
end
return hs
